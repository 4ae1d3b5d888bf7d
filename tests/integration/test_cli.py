"""The command line on a real server: migrate, check, token, and the refusals operators see."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from tests.db_support import TestServer, create_database, drop_database, ensure_runtime_role

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]


def _run(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def empty_database_url(pg_server: TestServer) -> Iterator[str]:
    ensure_runtime_role(pg_server)
    name = create_database(pg_server, "orquestador_cli")
    try:
        yield pg_server.url(name).render_as_string(hide_password=False)
    finally:
        drop_database(pg_server, name)


def test_migrate_upgrade_current_and_downgrade(empty_database_url: str) -> None:
    env = {
        "MIGRATION_DATABASE_URL": empty_database_url,
        "RUNTIME_DATABASE_ROLE": "orquestador_test_runtime",
    }
    assert _run(["migrate", "current"], env).stdout.strip() == "base"
    upgraded = _run(["migrate", "upgrade"], env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "database at revision 0004" in upgraded.stdout
    assert _run(["migrate", "current"], env).stdout.strip() == "0004"

    refused = _run(["migrate", "downgrade"], env)
    assert refused.returncode == 2
    assert "downgrade needs a target revision" in refused.stderr

    downgraded = _run(["migrate", "downgrade", "0002"], env)
    assert downgraded.returncode == 0, downgraded.stderr
    assert _run(["migrate", "current"], env).stdout.strip() == "0002"


def test_migrate_against_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    result = _run(
        ["migrate", "upgrade"], {"MIGRATION_DATABASE_URL": "postgresql://x@127.0.0.1:1/db"}
    )
    assert result.returncode == 1
    assert result.stderr.startswith("orquestador: migration failed:")
    assert "Traceback" not in result.stderr


def test_migrate_refuses_a_runtime_url_without_an_owner_url() -> None:
    result = _run(["migrate", "upgrade"], {"DATABASE_URL": "postgresql://app@127.0.0.1/db"})
    assert result.returncode == 2
    assert "MIGRATION_DATABASE_URL is not set" in result.stderr


def test_check_reports_an_unreachable_database() -> None:
    result = _run(["check"], {"DATABASE_URL": "postgresql://x@127.0.0.1:1/db"})
    assert result.returncode == 1
    assert result.stderr.startswith("orquestador: DATABASE_URL: cannot connect")


def test_check_passes_on_a_reachable_database(empty_database_url: str) -> None:
    result = _run(["check"], {"DATABASE_URL": empty_database_url})
    assert result.returncode == 0, result.stderr
    assert "configuration is valid" in result.stdout


def test_worker_refuses_to_start_when_not_enabled() -> None:
    result = _run(["worker"], {"DATABASE_URL": "postgresql://app@127.0.0.1/db"})
    assert result.returncode == 2
    assert "WORKER_ENABLED is not true" in result.stderr


def test_token_without_a_key_explains_where_keys_come_from(tmp_path: Path) -> None:
    result = _run(["token", "--sub", "ana", "--org", "acme"], {}, cwd=tmp_path)
    assert result.returncode == 2
    assert "no signing key" in result.stderr


def test_token_is_signed_with_the_configured_secret(tmp_path: Path) -> None:
    secret = "cli-test-secret-" + "x" * 32
    result = _run(
        ["token", "--sub", "ana", "--org", "acme", "--scope", "requests:read requests:write"],
        {"JWT_SECRET": secret},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(
        result.stdout.strip(), secret, algorithms=["HS256"], audience="orquestador-api"
    )
    assert (claims["sub"], claims["org"], claims["iss"]) == ("ana", "acme", "orquestador")
    assert claims["scope"] == "requests:read requests:write"


def test_dev_on_an_unreachable_database_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    result = _run(["dev"], {"DATABASE_URL": "postgresql://x@127.0.0.1:1/db"}, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("orquestador: migration failed:")
    assert "Traceback" not in result.stderr
