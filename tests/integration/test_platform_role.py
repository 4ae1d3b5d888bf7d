"""The platform role: INSERT of an event's own columns of platform_event, nothing else, granted by
`orquestador migrate`."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL

from orquestador.db import migrate
from orquestador.db.engine import make_engine
from orquestador.db.grants import PLATFORM_INSERT_COLUMNS
from tests.db_support import RUNTIME_ROLE, TestDatabase, TestServer, ensure_role

PLATFORM_ROLE = "orquestador_test_platform"
PLATFORM_PASSWORD = "orquestador-test-platform"
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")

INSERT_EVENT = (
    "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, data)"
    " VALUES ('org-a', 'evt-1', 'provisioned', 'vps', 'm-1', '{\"hostname\": \"web-1\"}')"
)
# Everything the platform may write, as docs/AUTOMATION.md shows it.
INSERT_WHOLE_EVENT = (
    "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, occurred_at, data)"
    " VALUES ('org-a', 'evt-2', 'provisioned', 'vps', 'm-2', '2026-11-30T10:00:00Z', '{}')"
    " ON CONFLICT DO NOTHING"
)


@pytest.fixture
def platform_role(pg_server: TestServer) -> str:
    ensure_role(pg_server, PLATFORM_ROLE, PLATFORM_PASSWORD)
    return PLATFORM_ROLE


def _platform_dsn(database: TestDatabase) -> str:
    url: URL = database.owner_url.set(username=PLATFORM_ROLE, password=PLATFORM_PASSWORD)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _columns_insertable(database: TestDatabase, role: str) -> set[str]:
    """The columns of platform_event ROLE may INSERT, granted on the table or column by column."""
    engine = make_engine(database.owner_dsn)
    try:
        with engine.connect() as connection:
            return set(
                connection.execute(
                    text(
                        "SELECT attname FROM pg_attribute"
                        " WHERE attrelid = 'platform_event'::regclass"
                        " AND attnum > 0 AND NOT attisdropped"
                        " AND has_column_privilege(:role, attrelid, attnum, 'INSERT')"
                    ),
                    {"role": role},
                ).scalars()
            )
    finally:
        engine.dispose()


def _privileges_held(database: TestDatabase, role: str) -> set[tuple[str, str]]:
    engine = make_engine(database.owner_dsn)
    try:
        with engine.connect() as connection:
            tables = connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ).scalars()
            return {
                (table, privilege)
                for table in list(tables)
                for privilege in PRIVILEGES
                if connection.execute(
                    text("SELECT has_table_privilege(:role, :table, :privilege)"),
                    {"role": role, "table": f"public.{table}", "privilege": privilege},
                ).scalar_one()
            }
    finally:
        engine.dispose()


def test_the_platform_role_may_insert_events_and_do_nothing_else(
    database: TestDatabase, platform_role: str
) -> None:
    owner = make_engine(database.owner_dsn)
    with owner.begin() as connection:
        # Given more than it should have: the grant takes it back.
        connection.execute(
            text(f"GRANT SELECT, UPDATE ON request, platform_event TO {platform_role}")
        )
    owner.dispose()

    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role=platform_role)

    # Nothing on any table as a whole; INSERT on the event's own columns.
    assert _privileges_held(database, platform_role) == set()
    assert _columns_insertable(database, platform_role) == set(
        PLATFORM_INSERT_COLUMNS["platform_event"]
    )
    with psycopg.connect(_platform_dsn(database)) as connection:
        # Inside the platform's own transaction, beside its own writes.
        with connection.transaction():
            connection.execute(INSERT_EVENT)
            connection.execute(INSERT_WHOLE_EVENT)
        # Delivering the same event twice is harmless with ON CONFLICT DO NOTHING.
        with connection.transaction():
            connection.execute(INSERT_EVENT + " ON CONFLICT DO NOTHING")
        for statement in (
            "SELECT * FROM platform_event",
            "UPDATE platform_event SET processed_at = now()",
            "DELETE FROM platform_event",
            "SELECT * FROM request",
            "SELECT * FROM hosting_plan",
            "INSERT INTO audit_event (org_id, kind) VALUES ('org-a', 'FORGED')",
        ):
            with (
                pytest.raises(psycopg.errors.InsufficientPrivilege),
                connection.transaction(),
            ):
                connection.execute(statement)
    runtime = make_engine(database.runtime_dsn)
    try:
        with runtime.connect() as connection:
            rows = connection.execute(text("SELECT id, processed_at FROM platform_event")).all()
    finally:
        runtime.dispose()
    assert sorted((row.id, row.processed_at) for row in rows) == [("evt-1", None), ("evt-2", None)]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("outcome", "'STARTED'"),
        ("processed_at", "now()"),
        ("request_id", "gen_random_uuid()"),
        ("execution_id", "gen_random_uuid()"),
        ("received_at", "now() - interval '1 day'"),
    ],
)
def test_the_platform_role_cannot_insert_an_event_already_processed(
    database: TestDatabase, platform_role: str, column: str, value: str
) -> None:
    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role=platform_role)
    forged = (
        f"INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, {column})"
        f" VALUES ('org-a', 'evt-forged', 'provisioned', 'vps', 'm-1', {value})"
    )
    with (
        psycopg.connect(_platform_dsn(database)) as connection,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        connection.execute(forged)
    runtime = make_engine(database.runtime_dsn)
    try:
        with runtime.connect() as connection:
            stored = connection.execute(text("SELECT count(*) FROM platform_event")).scalar_one()
    finally:
        runtime.dispose()
    assert stored == 0


def test_no_platform_role_configured_grants_it_nothing(
    database: TestDatabase, platform_role: str
) -> None:
    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role="")
    assert _privileges_held(database, platform_role) == set()


def test_the_runtime_role_cannot_be_the_platform_role(database: TestDatabase) -> None:
    with pytest.raises(migrate.MigrationFailed, match="role of its own"):
        migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role=RUNTIME_ROLE)
    # Nothing of the transaction stayed: the runtime role keeps its grants.
    assert ("request", "SELECT") in _privileges_held(database, RUNTIME_ROLE)


def test_migrate_grant_reads_platform_database_role(
    database: TestDatabase, platform_role: str
) -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        MIGRATION_DATABASE_URL=database.owner_dsn,
        RUNTIME_DATABASE_ROLE=RUNTIME_ROLE,
        PLATFORM_DATABASE_ROLE=platform_role,
    )
    result = subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "migrate", "grant"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert _columns_insertable(database, platform_role) == set(
        PLATFORM_INSERT_COLUMNS["platform_event"]
    )
