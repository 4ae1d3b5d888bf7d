"""A primary that turns read-only or ends our sessions: every pool is recycled, never a 500.

A demoted primary is emulated on the test server: `default_transaction_read_only` makes
every write fail with SQLSTATE 25006, `pg_terminate_backend` ends sessions with 57P01.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from orquestador.api.app import create_app
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.db.engine import is_retriable, make_engine
from tests.db_support import TestDatabase
from tests.integration.worker_support import (
    ORG,
    OWNER,
    flow_definition,
    publish_flow,
    registry_of,
)

JWT_SECRET = "failover-test-signing-key-0123456789"


def backends(engine: Engine, count: int) -> set[int]:
    """The server pids behind `count` connections checked out at once."""
    held = [engine.connect() for _ in range(count)]
    try:
        return {int(c.execute(text("SELECT pg_backend_pid()")).scalar_one()) for c in held}
    finally:
        for connection in held:
            connection.close()


@pytest.fixture
def runtime(database: TestDatabase) -> Iterator[Engine]:
    # No ping on checkout: the errors reach the statement, as in a busy process.
    engine = make_engine(database.runtime_dsn, pool_size=3, ping_after_idle_seconds=3600)
    try:
        yield engine
    finally:
        engine.dispose()


# Any write the runtime role may make.
PROBE_WRITE = text(
    "INSERT INTO page_session_revocation (token_sha256, org_id, subject, expires_at)"
    " VALUES (gen_random_uuid()::text, 'acme', 'probe', now())"
)


def write(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(PROBE_WRITE)


def test_a_refused_write_recycles_every_connection_of_the_pool(runtime: Engine) -> None:
    before = backends(runtime, 3)
    with runtime.connect() as conn:
        conn.execute(text("SET default_transaction_read_only = on"))
        conn.commit()
        with pytest.raises(Exception) as refused:
            conn.execute(PROBE_WRITE)
    assert getattr(refused.value.orig, "sqlstate", None) == "25006"
    assert refused.value.connection_invalidated and is_retriable(refused.value)
    after = backends(runtime, 3)
    assert not before & after, "a connection of the old server was handed out again"
    write(runtime)


def test_an_administrator_shutdown_recycles_the_pool(
    runtime: Engine, owner_engine: Engine, database: TestDatabase
) -> None:
    before = backends(runtime, 3)
    with owner_engine.connect() as conn:
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(:p)"),
            {"p": list(before)},
        )
    with pytest.raises(Exception) as ended, runtime.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert is_retriable(ended.value)
    after = backends(runtime, 3)
    assert not before & after
    write(runtime)


def test_the_api_answers_503_problems_while_the_database_refuses_writes(
    database: TestDatabase, owner_engine: Engine
) -> None:
    flow_id = publish_flow(owner_engine, flow_definition([]))
    settings = Settings.from_env(
        {},
        database_url=database.runtime_dsn,
        request_api_enabled=True,
        jwt_secret=JWT_SECRET,
    )
    app = create_app(settings, registry=registry_of())
    token = mint_token(
        settings, sub=OWNER, org=ORG, scopes=["requests:read", "requests:write"], ttl_seconds=600
    )
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    body = {"flowId": str(flow_id), "data": {}}
    assert client.post("/api/v1/requests", json=body, headers=headers).status_code == 201

    def demote(read_only: bool) -> None:
        setting = "SET default_transaction_read_only = on" if read_only else "RESET ALL"
        with owner_engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database.name}" {setting}'))
            # Sessions of the old primary end (57P01); the next ones are read-only.
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": database.name},
            )
            conn.commit()

    demote(True)
    try:
        for _ in range(4):  # each a new connection, each refused its write
            answer = client.post("/api/v1/requests", json=body, headers=headers)
            assert answer.status_code == 503, answer.data
            assert answer.content_type.startswith("application/problem+json")
        readiness = client.get("/readyz")
        assert readiness.status_code in (200, 503)  # reads still work on a read-only primary
    finally:
        demote(False)
    assert client.post("/api/v1/requests", json=body, headers=headers).status_code == 201
