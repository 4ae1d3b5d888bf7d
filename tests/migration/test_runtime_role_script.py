"""docs/deploy/create-runtime-role.sql: idempotent, its password from a psql variable."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, pool, text

from tests.db_support import TestServer
from tests.migration.deploy_support import RUNTIME_ROLE_SCRIPT as SCRIPT
from tests.migration.deploy_support import psql_binary


@pytest.fixture
def role(pg_server: TestServer) -> Iterator[str]:
    name = f"orquestador_script_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        pg_server.admin(f'DROP ROLE IF EXISTS "{name}"')


def _run(server: TestServer, *variables: str) -> subprocess.CompletedProcess[str]:
    url = server.admin_url.set(drivername="postgresql").render_as_string(hide_password=False)
    arguments = [arg for variable in variables for arg in ("-v", variable)]
    return subprocess.run(
        [psql_binary(), "-X", "-q", url, *arguments, "-f", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _password_hash(server: TestServer, role: str) -> tuple[bool, str | None]:
    engine = create_engine(server.admin_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = :r"),
                {"r": role},
            ).one()
    finally:
        engine.dispose()
    return row.rolcanlogin, row.rolpassword


def test_the_script_runs_twice_and_takes_its_password_from_a_variable(
    pg_server: TestServer, role: str
) -> None:
    first = _run(pg_server, f"role={role}", "password=first-secret")
    assert first.returncode == 0, first.stderr
    can_login, first_hash = _password_hash(pg_server, role)
    assert can_login and first_hash

    second = _run(pg_server, f"role={role}", "password=second-secret")
    assert second.returncode == 0, second.stderr
    assert _password_hash(pg_server, role)[1] not in (None, first_hash)


def test_the_script_refuses_to_run_without_a_password(pg_server: TestServer, role: str) -> None:
    result = _run(pg_server, f"role={role}")
    assert result.returncode != 0
    assert "no password: run psql -v password=" in result.stderr


def test_the_script_hard_codes_no_password() -> None:
    assert "PASSWORD '" not in SCRIPT.read_text()
