"""The first install of docs/OPERATIONS.md, step by step: owner role and database, runtime role,
migrate as the owner, check as the runtime role. Names are unique per run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy.engine import URL

from tests.db_support import TestServer
from tests.migration.deploy_support import RUNTIME_ROLE_SCRIPT, psql_binary

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]


@dataclass(frozen=True)
class Install:
    owner_url: URL
    runtime_url: URL
    runtime_role: str


@pytest.fixture
def install(server: TestServer) -> Iterator[Install]:
    suffix = uuid.uuid4().hex[:8]
    owner, runtime, database = f"owner_{suffix}", f"runtime_{suffix}", f"orquestador_{suffix}"
    owner_password, runtime_password = uuid.uuid4().hex, uuid.uuid4().hex
    # As the documentation says, with a superuser.
    server.admin(f"CREATE ROLE {owner} LOGIN PASSWORD '{owner_password}'")
    server.admin(f"CREATE DATABASE {database} OWNER {owner}")
    try:
        url = server.admin_url.set(drivername="postgresql").render_as_string(hide_password=False)
        created = subprocess.run(
            [
                psql_binary(),
                "-X",
                "-q",
                url,
                "-v",
                f"password={runtime_password}",
                "-v",
                f"role={runtime}",
                "-f",
                str(RUNTIME_ROLE_SCRIPT),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        yield Install(
            owner_url=server.admin_url.set(
                database=database, username=owner, password=owner_password
            ),
            runtime_url=server.admin_url.set(
                database=database, username=runtime, password=runtime_password
            ),
            runtime_role=runtime,
        )
    finally:
        server.admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        server.admin(f'DROP ROLE IF EXISTS "{runtime}"')
        server.admin(f'DROP ROLE IF EXISTS "{owner}"')


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, *args], env={**base, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_documented_first_install_leaves_a_runtime_role_that_passes_check(
    install: Install,
) -> None:
    env = {
        "MIGRATION_DATABASE_URL": install.owner_url.render_as_string(hide_password=False),
        "DATABASE_URL": install.runtime_url.render_as_string(hide_password=False),
    }
    # The runtime role is the user in DATABASE_URL: no RUNTIME_DATABASE_ROLE needed.
    migrated = _run(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert f"runtime role '{install.runtime_role}': grants in place" in migrated.stdout
    checked = _run(["check"], env)
    assert checked.returncode == 0, checked.stderr


def test_check_names_temporary_tables_for_the_runtime_role_and_migrate_grant_takes_them(
    install: Install, server: TestServer
) -> None:
    env = {
        "MIGRATION_DATABASE_URL": install.owner_url.render_as_string(hide_password=False),
        "DATABASE_URL": install.runtime_url.render_as_string(hide_password=False),
    }
    assert _run(["migrate"], env).returncode == 0
    database = install.owner_url.database
    # PUBLIC's by default: a database made (or restored) without the revoke.
    server.admin(f'GRANT TEMPORARY ON DATABASE "{database}" TO PUBLIC')

    checked = _run(["check"], env)
    assert checked.returncode == 1
    assert (
        f"role '{install.runtime_role}' may create temporary tables in database '{database}'"
        in checked.stderr
    )
    assert f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC" in checked.stderr

    granted = _run(["migrate", "grant"], env)
    assert granted.returncode == 0, granted.stderr
    assert _run(["check"], env).returncode == 0
    with (
        psycopg.connect(
            install.runtime_url.set(drivername="postgresql").render_as_string(hide_password=False)
        ) as connection,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        connection.execute("CREATE TEMPORARY TABLE audit_event (id bigint)")
