"""What the deployment tests share: the runtime-role script and a psql client to run it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

RUNTIME_ROLE_SCRIPT = (
    Path(__file__).resolve().parents[2] / "docs" / "deploy" / "create-runtime-role.sql"
)


def psql_binary() -> str:
    """psql from PATH, else the one the embedded server ships; skip the test without either."""
    found = shutil.which("psql")
    if found:
        return found
    try:
        from orquestador.db.embedded import _wheel_package

        return str(_wheel_package() / "pginstall" / "bin" / "psql")
    except Exception:
        pytest.skip("no psql client: neither on PATH nor in the embedded server")
