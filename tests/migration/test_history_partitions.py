"""Migration 0024 on a populated database: up, down and up again, every row kept."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, pool, text

from orquestador.db.schema import (
    HISTORY_PARTITIONS_FUNCTION,
    HISTORY_PURGE_FUNCTION,
    RUNTIME_GRANTS,
)
from tests.db_support import (
    RUNTIME_ROLE,
    TestServer,
    create_database,
    drop_database,
    ensure_runtime_role,
)
from tests.migration.migration_support import step

# Rows spread over 15 months back and one a year ahead (a clock far off): the history a
# real installation brings to the migration.
AUDIT_ROWS = 400
ATTEMPTS_PER_STEP = 3
STEPS = 60

_AUDIT = "SELECT id, org_id, kind, request_id, execution_id, actor, detail, created_at"
_ATTEMPTS = (
    "SELECT execution_id, action_id, attempt, fencing_token, status, error_code, message,"
    " started_at, finished_at"
)


@pytest.fixture
def database(server: TestServer) -> Iterator[tuple[TestServer, str]]:
    ensure_runtime_role(server)
    name = create_database(server, "orquestador_history")
    try:
        yield server, name
    finally:
        drop_database(server, name)


def _populate(engine: Engine) -> None:
    with engine.begin() as connection:
        flow_id = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) VALUES ('acme', 'f', 1, 'manual', '{}', '{}', 'ana') RETURNING id"
            )
        ).scalar_one()
        request_id = connection.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by)"
                " VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana') RETURNING id"
            ),
            {"flow": flow_id},
        ).scalar_one()
        execution_id = uuid.uuid4()
        connection.execute(
            text(
                "INSERT INTO execution (id, request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot)"
                " VALUES (:id, :request, 'acme', :flow, 'go', 1, 'new', '{}')"
            ),
            {"id": execution_id, "request": request_id, "flow": flow_id},
        )
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " SELECT :execution, 'step-' || s, 'FAILED', :attempts, 1, 'h',"
                " :execution || ':' || s, 'READ_ONLY', 'acme.x', 1"
                " FROM generate_series(1, :steps) s"
            ),
            {"execution": execution_id, "attempts": ATTEMPTS_PER_STEP, "steps": STEPS},
        )
        connection.execute(
            text(
                "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                " status, error_code, message, started_at, finished_at)"
                " SELECT :execution, 'step-' || s, a, a, 'FAILED', 'E', 'attempt ' || a,"
                " now() - make_interval(days => s * 7 + a), now() - make_interval(days => s * 7)"
                " FROM generate_series(1, :steps) s, generate_series(1, :attempts) a"
            ),
            {"execution": execution_id, "attempts": ATTEMPTS_PER_STEP, "steps": STEPS},
        )
        connection.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail,"
                " created_at)"
                " SELECT 'acme', 'K' || (i % 5), :request, CASE WHEN i % 3 = 0 THEN :execution"
                " END, 'ana', jsonb_build_object('i', i),"
                " now() - make_interval(hours => i * 27)"
                " FROM generate_series(1, :rows) i"
            ),
            {"request": request_id, "execution": execution_id, "rows": AUDIT_ROWS},
        )
        connection.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, created_at)"
                " VALUES ('acme', 'AHEAD', now() + interval '1 year')"
            )
        )


def _history(connection: Connection) -> tuple[list[tuple], list[tuple]]:
    audit = [tuple(r) for r in connection.execute(text(f"{_AUDIT} FROM audit_event ORDER BY id"))]
    attempts = [
        tuple(r)
        for r in connection.execute(
            text(f"{_ATTEMPTS} FROM action_attempt ORDER BY execution_id, action_id, attempt")
        )
    ]
    return audit, attempts


def _kinds(connection: Connection) -> dict[str, str]:
    rows = connection.execute(
        text(
            "SELECT relname, relkind FROM pg_class"
            " WHERE relname IN ('audit_event', 'action_attempt')"
            " AND relnamespace = CAST(current_schema() AS regnamespace)"
        )
    )
    return {str(k): v for k, v in rows}


def _months(connection: Connection, table: str) -> dict[str, int]:
    """Rows per partition of TABLE."""
    rows = connection.execute(
        text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")
    )
    return {str(k): v for k, v in rows}


def _runtime_table_grants(connection: Connection) -> dict[str, set[str]]:
    rows = connection.execute(
        text(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = :role"
        ),
        {"role": RUNTIME_ROLE},
    )
    granted: dict[str, set[str]] = {}
    for table, privilege in rows:
        granted.setdefault(table, set()).add(privilege)
    return granted


def _next_audit_id(engine: Engine) -> int:
    with engine.begin() as connection:
        return connection.execute(
            text("INSERT INTO audit_event (org_id, kind) VALUES ('acme', 'NEXT') RETURNING id")
        ).scalar_one()


def test_partitioning_keeps_every_row_up_down_and_up_again(
    database: tuple[TestServer, str],
) -> None:
    server, name = database
    owner = create_engine(server.url(name), poolclass=pool.NullPool)
    runtime = create_engine(server.url(name, runtime=True), poolclass=pool.NullPool)
    try:
        step(server, name, "0023")
        _populate(owner)
        with owner.connect() as connection:
            audit, attempts = _history(connection)
            grants = _runtime_table_grants(connection)
        assert len(audit) == AUDIT_ROWS + 1 and len(attempts) == STEPS * ATTEMPTS_PER_STEP

        step(server, name, "0024")
        with owner.connect() as connection:
            assert _kinds(connection) == {"audit_event": "p", "action_attempt": "p"}
            assert _history(connection) == (audit, attempts)
            assert _runtime_table_grants(connection) == grants
            audit_months = _months(connection, "audit_event")
            attempt_months = _months(connection, "action_attempt")
        # One partition a month holds the past; only the row a year ahead is in DEFAULT.
        assert audit_months.pop("audit_event_default") == 1
        assert len(audit_months) >= 14 and sum(audit_months.values()) == AUDIT_ROWS
        assert "action_attempt_default" not in attempt_months
        assert len(attempt_months) >= 13
        # The identity goes on where the old table's stood.
        first = _next_audit_id(owner)
        assert first == audit[-1][0] + 1
        with runtime.begin() as connection:
            # The leader's functions: the runtime role may run them; nothing here is past
            # ten years, and the months ahead are there already.
            made = connection.execute(text(f"SELECT {HISTORY_PARTITIONS_FUNCTION}(3)"))
            assert made.scalar_one() == 0
            purged = connection.execute(
                text(
                    f"SELECT {HISTORY_PURGE_FUNCTION}(interval '3650 days',"
                    " interval '3650 days', 1000)"
                )
            ).scalar_one()
        assert purged == 0

        step(server, name, "0023", down=True)
        with owner.connect() as connection:
            assert _kinds(connection) == {"audit_event": "r", "action_attempt": "r"}
            after_down = _history(connection)
            assert _runtime_table_grants(connection) == grants
            leftovers = connection.execute(
                text(
                    "SELECT count(*) FROM pg_class WHERE relname ~ '^(audit_event|action_attempt)_'"
                    " AND relkind IN ('r', 'p')"
                )
            ).scalar_one()
        assert after_down[0][:-1] == audit and after_down[0][-1][0] == first
        assert after_down[1] == attempts
        assert leftovers == 0
        assert _next_audit_id(owner) == first + 1

        step(server, name, "0024")
        with owner.connect() as connection:
            again = _history(connection)
            assert _runtime_table_grants(connection) == grants
        # Everything the downgrade kept, and the row written between.
        assert again[0][:-1] == after_down[0] and again[1] == after_down[1]
        assert _next_audit_id(owner) == first + 2
        assert set(grants) <= set(RUNTIME_GRANTS)
    finally:
        owner.dispose()
        runtime.dispose()
