"""A client command of the API starts without the server: neither SQLAlchemy nor Flask is
imported by the command line's parser or by the modules of its client commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

SERVER_MODULES = ("sqlalchemy", "flask", "psycopg", "orquestador.api")


@pytest.mark.parametrize(
    "module",
    ["orquestador.cli.main", "orquestador.cli.run", "orquestador.cli.executions"],
)
def test_a_client_command_imports_nothing_of_the_server(module: str) -> None:
    probe = (
        f"import sys, {module}\nprint(' '.join(m for m in {SERVER_MODULES!r} if m in sys.modules))"
    )

    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )

    assert loaded.stdout.strip() == ""
