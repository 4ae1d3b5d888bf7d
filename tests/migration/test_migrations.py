"""Migrations run step by step with data in place, back down to base, on every server we have."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, create_engine, inspect, pool, text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from orquestador.config import Settings
from orquestador.db import migrate
from orquestador.db.health import runtime_privilege_problems
from orquestador.db.schema import (
    PURGE_SIMULATIONS_FUNCTION,
    PURGE_SIMULATIONS_SIGNATURE,
    RUNTIME_GRANTS,
    RUNTIME_UPDATE_COLUMNS,
    SCHEDULE_UPDATE_COLUMNS,
    WRITE_BATCH_FUNCTION,
    WRITE_BATCH_SIGNATURE,
    declared_relation,
    metadata,
)
from tests.db_support import (
    RUNTIME_ROLE,
    TestServer,
    create_database,
    drop_database,
    ensure_runtime_role,
)
from tests.migration.migration_support import step


def _storage_parameters(connection: Connection) -> dict[str, set[str]]:
    """Each table's storage parameters (fillfactor, ...) as the database has them."""
    rows = connection.execute(
        text(
            """SELECT relname, reloptions FROM pg_class
               WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')
                 AND reloptions IS NOT NULL"""
        )
    )
    return {name: set(options) for name, options in rows if declared_relation(name, "table", {})}


def _declared_storage_parameters() -> dict[str, set[str]]:
    """Each table's storage parameters as orquestador/db/schema.py declares them."""
    return {
        table.name: {f"{key}={value}" for key, value in options.items()}
        for table in metadata.tables.values()
        if (options := table.dialect_options["postgresql"]["with"])
    }


@pytest.fixture
def empty_database(server: TestServer) -> Iterator[tuple[TestServer, str]]:
    ensure_runtime_role(server)
    name = create_database(server, "orquestador_migration")
    try:
        yield server, name
    finally:
        drop_database(server, name)


def _engine(url: object):
    return create_engine(url, poolclass=pool.NullPool)


SIMULATION_KEY = "fk_execution_request_id_simulation_request"
# What migration 0013 adds; revisions before it have none of these tables.
TABLES_OF_0013 = frozenset({"machine_credential", "page_session_revocation"})


# What migration 0014 adds: a column the runtime role may UPDATE.
# The columns the runtime role may UPDATE that a revision after 0013 added.
COLUMNS_ADDED = {
    "0014": {"machine_command": {"cancel_requested_at"}},
    "0015": {"execution": {"key_blocked"}, "key_release": {"id"}},
    "0016": {"rate_bucket": {"tokens", "refilled_at"}},
    "0019": {"approval": {"status", "decided_by", "decided_at", "comment"}},
    "0021": {"sign_in_link": {"used_at"}},
    "0022": {"panel_notice": {"dismissed_by"}},
    "0023": {"execution": {"accepted_revision"}},
    "0030": {"execution": {"continuations"}},
    "0034": {
        "execution": {"cancel_requested_at", "cancel_requested_by", "cancel_requested_reason"}
    },
    "0031": {
        "rollout": {
            "next_index",
            "running",
            "succeeded",
            "failed",
            "cancelled",
            "next_start_at",
            "paused_at",
            "paused_by",
            "cancelled_at",
            "cancelled_by",
            "changed_at",
        },
        "rollout_child": {"status", "ended_at"},
    },
    "0027": {
        "machine_command": {"deliver_by", "output_tail", "output_received", "output_size"},
        "machine_agent": {"last_seen_at"},
        "schedule": {"flow_key", "flow_trigger", "transition_id"},
    },
    "0017": {
        "schedule": set(SCHEDULE_UPDATE_COLUMNS) - {"flow_key", "flow_trigger", "transition_id"},
        "schedule_fire": {"request_id", "execution_id"},
    },
    "0018": {
        "bulk_action": {"status", "finished_at"},
        "bulk_item": {"outcome", "code", "detail", "finished_at"},
    },
}


def _declared_updates(
    without: frozenset[str] = frozenset(), *, at: str = "0013"
) -> dict[str, set[str]]:
    later: dict[str, set[str]] = {}
    for revision, added in COLUMNS_ADDED.items():
        if revision > at:
            for table, columns in added.items():
                later.setdefault(table, set()).update(columns)
    declared = {
        t: set(c) - later.get(t, set())
        for t, c in RUNTIME_UPDATE_COLUMNS.items()
        if t not in without
    }
    # A table a later revision created has no grants yet.
    return {t: c for t, c in declared.items() if c or t not in later}


def _owner_query(server: TestServer, name: str, sql: str, **params: object) -> list:
    engine = _engine(server.url(name))
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(sql), params))
    finally:
        engine.dispose()


def _may_update(server: TestServer, name: str, table: str, column: str) -> bool:
    [(allowed,)] = _owner_query(
        server,
        name,
        "SELECT has_column_privilege(:role, CAST(:table AS regclass), :column, 'UPDATE')",
        role=RUNTIME_ROLE,
        table=table,
        column=column,
    )
    return bool(allowed)


def _update_columns(server: TestServer, name: str) -> dict[str, set[str]]:
    """The runtime role's column-level UPDATE grants, by table."""
    rows = _owner_query(
        server,
        name,
        "SELECT c.relname, a.attname FROM pg_class c"
        " JOIN pg_attribute a ON a.attrelid = c.oid, aclexplode(a.attacl) x"
        " WHERE x.grantee = CAST(:role AS regrole) AND x.privilege_type = 'UPDATE'"
        " AND c.relnamespace = CAST('public' AS regnamespace)",
        role=RUNTIME_ROLE,
    )
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(table, set()).add(column)
    return columns


def _executors(server: TestServer, name: str, signature: str) -> set[str]:
    """Who may EXECUTE the function besides its owner; PUBLIC for everyone."""
    rows = _owner_query(
        server,
        name,
        "SELECT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(x.grantee) END"
        " FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) x"
        " WHERE p.oid = to_regprocedure(:f) AND x.privilege_type = 'EXECUTE'"
        " AND x.grantee <> p.proowner",
        f=signature,
    )
    return {grantee for (grantee,) in rows}


def _search_path(server: TestServer, name: str, signature: str) -> str | None:
    [(config,)] = _owner_query(
        server, name, "SELECT proconfig FROM pg_proc WHERE oid = to_regprocedure(:f)", f=signature
    )
    return next((c for c in config or [] if c.startswith("search_path=")), None)


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names()) - {"alembic_version"}


def test_upgrade_with_data_in_place_then_downgrade_to_base(
    empty_database: tuple[TestServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, name = empty_database
    engine = _engine(server.url(name))
    flows = {trigger: uuid.uuid4() for trigger in ("provisioned", "reinstalled", "manual")}
    plans = {trigger: uuid.uuid4() for trigger in (*flows, "none")}
    execution_id = uuid.uuid4()

    step(server, name, "0001")
    with engine.begin() as connection:
        for trigger, flow_id in flows.items():
            connection.execute(
                text(
                    "INSERT INTO flow (id, org_id, key, version, trigger, definition, data_schema,"
                    " created_by) VALUES (:id, 'acme', :key, 1, :trigger, '{}', '{}', 'ana')"
                ),
                {"id": flow_id, "key": f"on-{trigger}", "trigger": trigger},
            )
        for trigger, plan_id in plans.items():
            connection.execute(
                text(
                    "INSERT INTO hosting_plan (id, org_id, name, automation_flow_id)"
                    " VALUES (:id, 'acme', :name, :flow)"
                ),
                {"id": plan_id, "name": f"plan {trigger}", "flow": flows.get(trigger)},
            )
        request_id = connection.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by)"
                " VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana') RETURNING id"
            ),
            {"flow": flows["manual"]},
        ).scalar_one()
        connection.execute(
            text(
                "INSERT INTO execution (id, request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot)"
                " VALUES (:id, :request, 'acme', :flow, 'go', 1, 'new', '{}')"
            ),
            {"id": execution_id, "request": request_id, "flow": flows["manual"]},
        )

    step(server, name, "0002")
    with engine.begin() as connection:
        for action_id in ("charge", "notify"):
            connection.execute(
                text(
                    "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                    " fencing_token, input_hash, external_key, capability, adapter_version)"
                    " VALUES (:execution, :action, 'SUCCEEDED', 1, 1, 'h', :key, 'acme.x', 1)"
                ),
                {
                    "execution": execution_id,
                    "action": action_id,
                    "key": f"{execution_id}:{action_id}",
                },
            )

    step(server, name, "0003")
    with engine.connect() as connection:
        effects = connection.execute(text("SELECT DISTINCT effect FROM action_execution")).scalars()
        assert list(effects) == ["NON_IDEMPOTENT_WRITE"]
        column = next(
            c for c in inspect(connection).get_columns("action_execution") if c["name"] == "effect"
        )
        assert column["nullable"] is False

    with caplog.at_level(logging.INFO, logger="orquestador.migrations"):
        step(server, name, "0004")
    with engine.connect() as connection:
        bindings = set(
            connection.execute(text("SELECT plan_id, moment, flow_id FROM plan_flow_binding")).all()
        )
        legacy = [c["name"] for c in inspect(connection).get_columns("hosting_plan")]
    assert bindings == {
        (plans["provisioned"], "provisioned", flows["provisioned"]),
        (plans["reinstalled"], "reinstalled", flows["reinstalled"]),
    }
    assert "automation_flow_id" not in legacy
    reports = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(reports) == 1
    assert str(plans["manual"]) in reports[0] and "'manual'" in reports[0]

    with engine.begin() as connection:
        # What the error-exit bug left behind: the JSON value null where NULL was meant.
        connection.execute(
            text("UPDATE execution SET result = 'null'::jsonb WHERE id = :id"),
            {"id": execution_id},
        )
    step(server, name, "0005")
    with engine.connect() as connection:
        # Checkpoints that had ended seed the attempt history with their latest attempt.
        history = connection.execute(
            text("SELECT action_id, attempt, status FROM action_attempt ORDER BY action_id")
        ).all()
        result = connection.execute(
            text("SELECT result IS NULL FROM execution WHERE id = :id"), {"id": execution_id}
        ).scalar_one()
    assert [tuple(row) for row in history] == [
        ("charge", 1, "SUCCEEDED"),
        ("notify", 1, "SUCCEEDED"),
    ]
    assert result is True

    step(server, name, "0006")
    with engine.connect() as connection:
        bases = connection.execute(text("SELECT DISTINCT attempt_base FROM action_execution"))
        assert list(bases.scalars()) == [0]  # no approved retry yet: the budget is whole

    step(server, name, "0007")

    step(server, name, "0008")
    with engine.connect() as connection:
        keys = dict(connection.execute(text("SELECT id, key FROM hosting_plan")).all())
        # Plans made before the platform's own ids keep their uuid as key.
        assert keys == {plan: str(plan) for plan in plans.values()}
        first_starts = connection.execute(
            text("SELECT count(*) FROM action_execution WHERE first_started_at IS NULL")
        ).scalar_one()
        assert first_starts == 0

    step(server, name, "0009")

    step(server, name, "0010")
    with engine.connect() as connection:
        # The protocol writer's batch function, run with the caller's rights.
        definer = connection.execute(
            text("SELECT prosecdef FROM pg_proc WHERE oid = to_regprocedure(:f)"),
            {"f": WRITE_BATCH_SIGNATURE},
        ).scalar_one()
        assert definer is False

    step(server, name, "0011")
    with engine.connect() as connection:
        # The same function, rewritten in place: still the caller's rights, and it now
        # answers which rows another session held locked.
        definer, body = connection.execute(
            text("SELECT prosecdef, prosrc FROM pg_proc WHERE oid = to_regprocedure(:f)"),
            {"f": WRITE_BATCH_SIGNATURE},
        ).one()
        assert definer is False and "SKIP LOCKED" in body

    # A dry run beside the real request: a simulated request with its simulated execution.
    with engine.begin() as connection:
        simulated_request = connection.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,"
                " simulation) VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana', true)"
                " RETURNING id"
            ),
            {"flow": flows["manual"]},
        ).scalar_one()
        connection.execute(
            text(
                "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot, simulation)"
                " VALUES (:request, 'acme', :flow, 'go', 1, 'new', '{}', true)"
            ),
            {"request": simulated_request, "flow": flows["manual"]},
        )
    assert _may_update(server, name, "request", "simulation")
    assert "PUBLIC" in _executors(server, name, WRITE_BATCH_SIGNATURE)

    step(server, name, "0012")
    with engine.connect() as connection:
        validated = connection.execute(
            text("SELECT convalidated FROM pg_constraint WHERE conname = :name"),
            {"name": SIMULATION_KEY},
        ).scalar_one()
    assert validated is True
    # Neither kind of execution can join the other kind's request, even as the owner.
    for request, simulation in ((simulated_request, False), (request_id, True)):
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                    " accepted_revision, accepted_state, actor_snapshot, simulation)"
                    " VALUES (:request, 'acme', :flow, 'go', 2, 'new', '{}', :simulation)"
                ),
                {"request": request, "flow": flows["manual"], "simulation": simulation},
            )
    assert _update_columns(server, name) == _declared_updates(without=TABLES_OF_0013)
    assert not any("UPDATE" in p for p in _runtime_grants(server, name).values())
    assert not _may_update(server, name, "request", "simulation")
    for signature in (PURGE_SIMULATIONS_SIGNATURE, WRITE_BATCH_SIGNATURE):
        assert _executors(server, name, signature) == {RUNTIME_ROLE}
        assert _search_path(server, name, signature) == "search_path=pg_catalog, public, pg_temp"

    step(server, name, "0013")
    with engine.connect() as connection:
        assert _tables(connection) >= TABLES_OF_0013
        assert connection.execute(text("SELECT count(*) FROM request")).scalar_one() == 2
    granted = _runtime_grants(server, name)
    assert granted["machine_credential"] == {"SELECT"}
    assert granted["page_session_revocation"] == {"SELECT", "INSERT", "DELETE"}
    assert _update_columns(server, name) == _declared_updates()
    _runtime_role_may_revoke_credentials_only(server, name)

    command_id = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO machine_command (id, org_id, machine_id, command, external_key,"
                " status) VALUES (:id, 'acme', 'm-1', 'poweroff', :key, 'sent')"
            ),
            {"id": command_id, "key": f"{execution_id}:power"},
        )
    step(server, name, "0014")
    assert _update_columns(server, name) == _declared_updates(at="0014")
    runtime = _engine(server.url(name, runtime=True))
    with runtime.begin() as connection:
        # What a cancel does to a command an agent took, then what the agent reports.
        connection.execute(
            text(
                "UPDATE machine_command SET cancel_requested_at = now(), status = 'cancelled'"
                " WHERE id = :id"
            ),
            {"id": command_id},
        )
    runtime.dispose()

    # 0015: the executions written before it run at priority 5 with no key.
    step(server, name, "0015")
    assert _update_columns(server, name) == _declared_updates(at="0015")
    with engine.connect() as connection:
        before = connection.execute(
            text("SELECT priority, concurrency_key, key_blocked FROM execution WHERE id = :id"),
            {"id": execution_id},
        ).one()
    assert tuple(before) == (5, None, False)

    step(server, name, "0016")
    assert _update_columns(server, name) == _declared_updates(at="0016")

    # 0017: a flow may have the trigger `schedule`; a schedule fires it.
    step(server, name, "0017")
    assert _update_columns(server, name) == _declared_updates(at="0017")
    scheduled_flow = _schedule_in_place(server, name)

    step(server, name, "0018")
    assert _update_columns(server, name) == _declared_updates(at="0018")
    granted = _runtime_grants(server, name)
    assert granted["bulk_action"] == granted["bulk_item"] == {"SELECT", "INSERT", "DELETE"}

    # 0019 to 0021: approvals; a dry run's outcomes; sign-in links.
    step(server, name, "0021")
    assert _update_columns(server, name) == _declared_updates(at="0021")

    # 0022: who dismissed a notice; 0023: a retry with a correction moves the execution's
    # accepted revision; 0024: the history tables partitioned by month (grants unchanged);
    # 0025: the traceparent an execution and an e-mail continue (inserted only).
    for revision in ("0022", "0023", "0024", "0025"):
        step(server, name, revision)
        assert _update_columns(server, name) == _declared_updates(at=revision)

    # 0027: every command has a deliver-by time (one written before it: 15 minutes from
    # the upgrade), and a command may end `expired`; downgraded, it reads as cancelled.
    step(server, name, "0027")
    assert _update_columns(server, name) == _declared_updates(at="0027")
    with engine.begin() as connection:
        left = connection.execute(
            text("SELECT deliver_by - clock_timestamp() FROM machine_command WHERE id = :id"),
            {"id": command_id},
        ).scalar_one()
        assert timedelta(minutes=14) < left <= timedelta(minutes=15)
        expired = connection.execute(
            text(
                "INSERT INTO machine_command (org_id, machine_id, command, external_key,"
                " status, finished_at) VALUES ('acme', 'm-1', 'reboot', :key, 'expired', now())"
                " RETURNING id"
            ),
            {"key": f"{execution_id}:reboot"},
        ).scalar_one()
        # A schedule may now start a manual flow, by its key and a transition.
        connection.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, flow_key, flow_trigger,"
                " transition_id, every_seconds, updated_by) SELECT org_id, 'manual-one', id,"
                " key, trigger, 'go', 60, 'ana' FROM flow WHERE id = :flow"
            ),
            {"flow": flows["manual"]},
        )
    step(server, name, "0025", down=True)
    with engine.connect() as connection:
        status = connection.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": expired}
        ).scalar_one()
        columns = {c["name"] for c in inspect(connection).get_columns("machine_command")}
    assert status == "cancelled" and not {"deliver_by", "output_tail"} & columns
    with engine.connect() as connection:
        # The older code cannot fire a manual flow: that schedule went, the other stays.
        kept = connection.execute(text("SELECT id FROM schedule ORDER BY id")).scalars().all()
    assert kept == ["s"]
    assert _update_columns(server, name) == _declared_updates(at="0025")
    step(server, name, "0027")
    # 0029: the owner's bounds on the definer functions (the runtime role reads them).
    step(server, name, "0029")
    assert _update_columns(server, name) == _declared_updates(at="0029")
    # 0030: the execution a continuation continues, and the count an operator's retry
    # starts again.
    step(server, name, "0030")
    assert _update_columns(server, name) == _declared_updates(at="0030")
    # 0031: rollouts, their children, and the parent a child names.
    step(server, name, "0031")
    assert _update_columns(server, name) == _declared_updates(at="0031")
    # 0032: a bulk item remembers the execution as the bulk found it.
    step(server, name, "0032")
    assert _update_columns(server, name) == _declared_updates(at="0032")
    # 0033: the partial index the quota openExecutions counts from.
    step(server, name, "0033")
    assert _update_columns(server, name) == _declared_updates(at="0033")
    # 0034: a cancel asked of a RUNNING execution, and the batch writer honouring it.
    step(server, name, "0034")
    assert _update_columns(server, name) == _declared_updates(at="0034")
    # 0035: request keeps room on its pages for its updates to stay HOT.
    step(server, name, "0035")
    assert _update_columns(server, name) == _declared_updates(at="0035")
    # 0036: the batch writer takes a safe step's whole attempt with its success.
    step(server, name, "0036")
    assert _update_columns(server, name) == _declared_updates(at="0036")

    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": declared_relation}
        )
        assert compare_metadata(context, metadata) == []
        # Storage parameters are not compared by alembic: the schema's must be the tables'.
        assert _storage_parameters(connection) == _declared_storage_parameters()

    step(server, name, "0013", down=True)
    with engine.connect() as connection:
        # The older code knows no schedule: its flow can still be started by hand.
        trigger = connection.execute(
            text("SELECT trigger FROM flow WHERE id = :id"), {"id": scheduled_flow}
        ).scalar_one()
        assert trigger == "manual" and not {"schedule", "schedule_fire"} & _tables(connection)
        # The older code knows no cancelled command: it reads as failed, final either way.
        status = connection.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()
        columns = {c["name"] for c in inspect(connection).get_columns("machine_command")}
    assert status == "failed" and "cancel_requested_at" not in columns
    assert _update_columns(server, name) == _declared_updates()
    step(server, name, "0014")

    step(server, name, "0012", down=True)
    with engine.connect() as connection:
        assert not TABLES_OF_0013 & _tables(connection)
    assert _update_columns(server, name) == _declared_updates(without=TABLES_OF_0013)
    step(server, name, "0013")

    step(server, name, "0011", down=True)
    with engine.connect() as connection:
        keys = connection.execute(
            text("SELECT count(*) FROM pg_constraint WHERE conname IN (:key, :unique)"),
            {"key": SIMULATION_KEY, "unique": "uq_request_id_simulation"},
        ).scalar_one()
    assert keys == 0
    assert _may_update(server, name, "request", "simulation")
    assert "PUBLIC" in _executors(server, name, WRITE_BATCH_SIGNATURE)
    assert _search_path(server, name, PURGE_SIMULATIONS_SIGNATURE) != (
        "search_path=pg_catalog, public, pg_temp"
    )
    step(server, name, "0012")
    assert _update_columns(server, name) == _declared_updates(without=TABLES_OF_0013)

    step(server, name, "0003", down=True)
    with engine.connect() as connection:
        restored = dict(
            connection.execute(text("SELECT id, automation_flow_id FROM hosting_plan")).all()
        )
    assert restored[plans["provisioned"]] == flows["provisioned"]
    assert restored[plans["reinstalled"]] == flows["reinstalled"]
    assert restored[plans["none"]] is None

    step(server, name, "base", down=True)
    with engine.connect() as connection:
        assert _tables(connection) == set()
    engine.dispose()


def _schedule_in_place(server: TestServer, name: str) -> uuid.UUID:
    """0017's limits: the runtime role puts and fires schedules, and changes nothing else."""
    owner = _engine(server.url(name))
    with owner.begin() as connection:
        flow_id = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) VALUES ('acme', 'tick', 1, 'schedule', '{}', '{}', 'ana')"
                " RETURNING id"
            )
        ).scalar_one()
    owner.dispose()
    runtime = _engine(server.url(name, runtime=True))
    try:
        with runtime.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO schedule (org_id, id, flow_id, every_seconds, updated_by,"
                    " next_fire_at) VALUES ('acme', 's', :flow, 60, 'ana', now())"
                ),
                {"flow": flow_id},
            )
            connection.execute(
                text(
                    "INSERT INTO schedule_fire (org_id, schedule_id, fire_time)"
                    " VALUES ('acme', 's', now())"
                )
            )
            connection.execute(
                text("UPDATE schedule SET next_fire_at = now() + interval '1 minute', missed = 1")
            )
        for statement in (
            "UPDATE schedule SET org_id = 'other'",
            "UPDATE schedule SET flow_trigger = 'manual'",
            "UPDATE schedule_fire SET fire_time = now()",
        ):
            with pytest.raises(ProgrammingError) as raised, runtime.begin() as connection:
                connection.execute(text(statement))
            assert getattr(raised.value.orig, "sqlstate", None) == "42501", statement
    finally:
        runtime.dispose()
    return flow_id


def _runtime_role_may_revoke_credentials_only(server: TestServer, name: str) -> None:
    """0013's limits: credentials are read and revoked, never made or changed otherwise."""
    owner = _engine(server.url(name))
    with owner.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO machine_credential (id, org_id, machine_id, issued_at, expires_at,"
                " issued_by) VALUES ('c-1', 'acme', 'm-1', now(), now() + interval '1 day',"
                " 'cli:ana')"
            )
        )
    owner.dispose()
    runtime = _engine(server.url(name, runtime=True))
    try:
        for statement in (
            "INSERT INTO machine_credential (id, org_id, machine_id, issued_at, expires_at,"
            " issued_by) VALUES ('c-2', 'acme', 'm-1', now(), now() + interval '9 years', 'x')",
            "UPDATE machine_credential SET expires_at = now() + interval '9 years'",
            "UPDATE machine_credential SET machine_id = 'm-2', org_id = 'other'",
            "DELETE FROM machine_credential",
            "UPDATE page_session_revocation SET expires_at = now()",
        ):
            with pytest.raises(ProgrammingError) as raised, runtime.begin() as connection:
                connection.execute(text(statement))
            assert getattr(raised.value.orig, "sqlstate", None) == "42501", statement
        with runtime.begin() as connection:
            connection.execute(
                text(
                    "UPDATE machine_credential SET revoked_at = now(), revoked_by = 'ops'"
                    " WHERE id = 'c-1'"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO page_session_revocation (token_sha256, org_id, subject,"
                    " expires_at) VALUES ('d', 'acme', 'ana', now() - interval '1 second')"
                )
            )
            connection.execute(text("DELETE FROM page_session_revocation WHERE expires_at < now()"))
    finally:
        runtime.dispose()


def test_binding_schema_rejects_a_flow_whose_trigger_is_not_the_moment(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    step(server, name, "head")
    engine = _engine(server.url(name, runtime=True))
    with engine.begin() as connection:
        flow_id = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) VALUES ('acme', 'gone', 1, 'deleted', '{}', '{}', 'ana') RETURNING id"
            )
        ).scalar_one()
        plan_id = connection.execute(
            text(
                "INSERT INTO hosting_plan (org_id, key, name)"
                " VALUES ('acme', 'p', 'p') RETURNING id"
            )
        ).scalar_one()
    insert = text("INSERT INTO plan_flow_binding (plan_id, moment, flow_id) VALUES (:p, :m, :f)")
    for moment in ("provisioned", "manual"):
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(insert, {"p": plan_id, "m": moment, "f": flow_id})
    with engine.begin() as connection:
        connection.execute(insert, {"p": plan_id, "m": "deleted", "f": flow_id})
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(insert, {"p": plan_id, "m": "deleted", "f": flow_id})
    engine.dispose()


FORBIDDEN_TO_THE_RUNTIME_ROLE = [
    "CREATE TABLE intruder (id int)",
    "UPDATE audit_event SET kind = 'REWRITTEN'",
    "DELETE FROM audit_event",
    "TRUNCATE audit_event",
    "DELETE FROM action_attempt",
    # A month of the history, named directly: no privilege on it at all.
    "DELETE FROM audit_event_default",
    "DROP TABLE action_attempt_default",
    "ALTER TABLE audit_event DETACH PARTITION audit_event_default",
    "UPDATE flow SET definition = '{}'",
    "ALTER TABLE request ADD COLUMN intruder int",
    "DROP TABLE execution",
]


def test_runtime_role_cannot_run_ddl_or_rewrite_audit(
    empty_database: tuple[TestServer, str],
) -> None:
    # One migrated database for every statement: each is tried in a transaction of its
    # own, and a refused one changes nothing for the next.
    server, name = empty_database
    step(server, name, "head")
    engine = _engine(server.url(name, runtime=True))
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO audit_event (org_id, kind) VALUES ('acme', 'TRANSITION_ACCEPTED')")
        )
    allowed = []
    for statement in FORBIDDEN_TO_THE_RUNTIME_ROLE:
        try:
            with engine.begin() as connection:
                connection.execute(text(statement))
        except ProgrammingError as refused:
            assert getattr(refused.orig, "sqlstate", None) in ("42501", "42P01"), statement
            assert "permission denied" in str(refused.orig) or "must be owner" in str(
                refused.orig
            ), statement
        else:
            allowed.append(statement)
    engine.dispose()
    assert allowed == [], f"the runtime role may run: {allowed}"


def _may_purge_simulations(server: TestServer, name: str) -> bool:
    engine = _engine(server.url(name))
    with engine.connect() as connection:
        allowed = connection.execute(
            text("SELECT has_function_privilege(:role, :f, 'EXECUTE')"),
            {"role": RUNTIME_ROLE, "f": PURGE_SIMULATIONS_SIGNATURE},
        ).scalar_one()
    engine.dispose()
    return bool(allowed)


def _runtime_grants(server: TestServer, name: str) -> dict[str, set[str]]:
    engine = _engine(server.url(name))
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
                " WHERE grantee = :role"
            ),
            {"role": RUNTIME_ROLE},
        ).all()
    engine.dispose()
    granted: dict[str, set[str]] = {}
    for table, privilege in rows:
        granted.setdefault(table, set()).add(privilege)
    return granted


def test_runtime_role_gets_exactly_the_declared_grants(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    step(server, name, "head")
    granted = _runtime_grants(server, name)
    assert granted == {table: set(privileges) for table, privileges in RUNTIME_GRANTS.items()}
    assert _update_columns(server, name) == {t: set(c) for t, c in RUNTIME_UPDATE_COLUMNS.items()}


def test_no_table_is_declared_with_a_table_wide_update() -> None:
    # UPDATE is granted column by column (RUNTIME_UPDATE_COLUMNS), never for a whole table.
    assert not any("UPDATE" in privileges for privileges in RUNTIME_GRANTS.values())
    for table, updated in RUNTIME_UPDATE_COLUMNS.items():
        assert set(updated) <= set(metadata.tables[table].columns.keys()), table


def test_granting_again_repairs_a_database_migrated_without_the_role(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    url = server.url(name).render_as_string(hide_password=False)
    migrate.upgrade(migrate.alembic_config(url=url, runtime_role=None))
    assert _runtime_grants(server, name) == {}
    for _ in range(2):  # idempotent
        migrate.grant_runtime_role(url, RUNTIME_ROLE)
        granted = _runtime_grants(server, name)
        assert granted == {t: set(p) for t, p in RUNTIME_GRANTS.items()}
        assert _update_columns(server, name) == {
            t: set(c) for t, c in RUNTIME_UPDATE_COLUMNS.items()
        }
        assert _may_purge_simulations(server, name)
        assert _executors(server, name, WRITE_BATCH_SIGNATURE) == {RUNTIME_ROLE}


def test_granting_again_takes_back_a_table_wide_update(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    step(server, name, "head")
    server_url = server.url(name)
    engine = _engine(server_url)
    with engine.begin() as connection:
        # Given by hand, or left by a release before 0012.
        connection.execute(text(f"GRANT UPDATE ON request, execution TO {RUNTIME_ROLE}"))
    engine.dispose()
    assert _may_update(server, name, "request", "simulation")
    migrate.grant_runtime_role(server_url.render_as_string(hide_password=False), RUNTIME_ROLE)
    assert not _may_update(server, name, "request", "simulation")
    assert not _may_update(server, name, "execution", "simulation")
    assert _update_columns(server, name) == {t: set(c) for t, c in RUNTIME_UPDATE_COLUMNS.items()}


def test_no_project_function_is_executable_by_public_and_definers_pin_their_path(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    step(server, name, "head")
    # Every function of the tables' schema, whatever a later revision adds.
    functions = _owner_query(
        server,
        name,
        "SELECT p.proname, p.oid::regprocedure::text, p.prosecdef FROM pg_proc p"
        " WHERE p.pronamespace = CAST('public' AS regnamespace)"
        " AND p.proname LIKE 'orquestador%'",
    )
    assert {function for function, _, _ in functions} >= {
        PURGE_SIMULATIONS_FUNCTION,
        WRITE_BATCH_FUNCTION,
    }
    for _, signature, definer in functions:
        assert "PUBLIC" not in _executors(server, name, signature), signature
        if definer:
            assert _search_path(server, name, signature) == (
                "search_path=pg_catalog, public, pg_temp"
            ), signature


def test_a_real_execution_on_a_simulated_request_is_kept_and_reported(
    empty_database: tuple[TestServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    # What the bug of 0011 let through: a real transition accepted on a dry run's request.
    server, name = empty_database
    step(server, name, "0011")
    engine = _engine(server.url(name))
    with engine.begin() as connection:
        flow_id = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) VALUES ('acme', 'f', 1, 'manual', '{}', '{}', 'ana') RETURNING id"
            )
        ).scalar_one()
        mixed = connection.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,"
                " simulation, created_at) VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana',"
                " true, now() - interval '30 days') RETURNING id"
            ),
            {"flow": flow_id},
        ).scalar_one()
        for simulation in (True, False):
            connection.execute(
                text(
                    "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                    " accepted_revision, accepted_state, actor_snapshot, simulation,"
                    " status, finished_at)"
                    " VALUES (:request, 'acme', :flow, 'go', 1, 'new', '{}', :simulation,"
                    " 'SUCCEEDED', now())"
                ),
                {"request": mixed, "flow": flow_id, "simulation": simulation},
            )

    with caplog.at_level(logging.WARNING, logger="orquestador.migrations"):
        step(server, name, "0012")
    [report] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(mixed) in report and SIMULATION_KEY in report
    with engine.connect() as connection:
        validated = connection.execute(
            text("SELECT convalidated FROM pg_constraint WHERE conname = :name"),
            {"name": SIMULATION_KEY},
        ).scalar_one()
    assert validated is False
    runtime = _engine(server.url(name, runtime=True))
    with runtime.begin() as connection:
        purged = connection.execute(
            text(f"SELECT {PURGE_SIMULATIONS_FUNCTION}(interval '1 day', 10)")
        ).scalar_one()
        # New rows are checked all the same.
        with pytest.raises(IntegrityError), connection.begin_nested():
            connection.execute(
                text(
                    "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                    " accepted_revision, accepted_state, actor_snapshot)"
                    " VALUES (:request, 'acme', :flow, 'go', 2, 'new', '{}')"
                ),
                {"request": mixed, "flow": flow_id},
            )
    runtime.dispose()
    assert purged == 0
    with engine.connect() as connection:
        kept = connection.execute(
            text("SELECT count(*) FROM execution WHERE request_id = :id"), {"id": mixed}
        ).scalar_one()
    assert kept == 2
    step(server, name, "0011", down=True)
    engine.dispose()


def test_check_names_the_columns_and_functions_the_runtime_role_lacks(
    empty_database: tuple[TestServer, str],
) -> None:
    server, name = empty_database
    step(server, name, "head")
    runtime_dsn = server.url(name, runtime=True).render_as_string(hide_password=False)
    settings = Settings.from_env({}, database_url=runtime_dsn)
    assert runtime_privilege_problems(settings) == []
    engine = _engine(server.url(name))
    with engine.begin() as connection:
        connection.execute(text(f"REVOKE UPDATE (wait_key) ON execution FROM {RUNTIME_ROLE}"))
        connection.execute(text(f"REVOKE UPDATE ON email_outbox FROM {RUNTIME_ROLE}"))
        connection.execute(
            text(f"REVOKE EXECUTE ON FUNCTION {WRITE_BATCH_SIGNATURE} FROM {RUNTIME_ROLE}")
        )
    engine.dispose()
    role = f"DATABASE_URL: role {RUNTIME_ROLE!r} lacks"
    assert runtime_privilege_problems(settings) == [
        f"{role} UPDATE (wait_key) on table execution",
        f"{role} UPDATE on table email_outbox",
        f"{role} EXECUTE on function {WRITE_BATCH_SIGNATURE}",
        f"grant them as the owner: RUNTIME_DATABASE_ROLE={RUNTIME_ROLE} orquestador migrate grant",
    ]
