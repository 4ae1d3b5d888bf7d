"""The runtime role cannot delete real history through the purge function, nor can any other
role run the project's functions: each attack of the third review, run as the role itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import ProgrammingError

from orquestador.db import migrate
from orquestador.db.schema import PURGE_SIMULATIONS_FUNCTION, WRITE_BATCH_FUNCTION
from tests.db_support import RUNTIME_ROLE, TestDatabase, TestServer, ensure_role

PURGE = text(f"SELECT {PURGE_SIMULATIONS_FUNCTION}(interval '1 day', 100)")
INSUFFICIENT_PRIVILEGE = "42501"
PLATFORM_ROLE = "orquestador_test_platform"
PLATFORM_PASSWORD = "orquestador-test-platform"


@dataclass(frozen=True)
class History:
    """A real request, a month old, with a finished execution, its checkpoint and attempt."""

    request_id: uuid.UUID
    execution_id: uuid.UUID


def _flow(connection: Connection) -> uuid.UUID:
    return connection.execute(
        text(
            "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
            " created_by) VALUES ('acme', :key, 1, 'manual', '{}', '{}', 'ana') RETURNING id"
        ),
        {"key": f"f-{uuid.uuid4().hex[:8]}"},
    ).scalar_one()


def _request(connection: Connection, flow_id: uuid.UUID, *, simulation: bool) -> uuid.UUID:
    return connection.execute(
        text(
            "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,"
            " simulation, created_at) VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana',"
            " :simulation, now() - interval '30 days') RETURNING id"
        ),
        {"flow": flow_id, "simulation": simulation},
    ).scalar_one()


@pytest.fixture
def history(owner_engine: Engine) -> History:
    with owner_engine.begin() as connection:
        flow_id = _flow(connection)
        request_id = _request(connection, flow_id, simulation=False)
        execution_id = connection.execute(
            text(
                "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot, status, finished_at)"
                " VALUES (:request, 'acme', :flow, 'go', 2, 'new', '{}', 'SUCCEEDED', now())"
                " RETURNING id"
            ),
            {"request": request_id, "flow": flow_id},
        ).scalar_one()
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " VALUES (:execution, 'charge', 'SUCCEEDED', 1, 1, 'h', :key,"
                " 'NON_IDEMPOTENT_WRITE', 'billing.charge', 1)"
            ),
            {"execution": execution_id, "key": f"{execution_id}:charge"},
        )
        connection.execute(
            text(
                "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                " status, started_at, finished_at)"
                " VALUES (:execution, 'charge', 1, 1, 'SUCCEEDED', now(), now())"
            ),
            {"execution": execution_id},
        )
    return History(request_id, execution_id)


def _intact(owner_engine: Engine, history: History) -> bool:
    """Whether the real request and everything under it are still there, still real."""
    with owner_engine.connect() as connection:
        simulation = connection.execute(
            text("SELECT simulation FROM request WHERE id = :id"), {"id": history.request_id}
        ).scalar_one_or_none()
        rows = [
            connection.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = :id"),
                {"id": history.execution_id},
            ).scalar_one()
            for table, column in (
                ("execution", "id"),
                ("action_execution", "execution_id"),
                ("action_attempt", "execution_id"),
            )
        ]
    return simulation is False and rows == [1, 1, 1]


def test_a_real_request_cannot_be_made_a_simulation_and_purged(
    runtime_engine: Engine, owner_engine: Engine, history: History
) -> None:
    # (a) Both rows in one statement, so that only the grants, not the key tying the
    # two, can stop it.
    with runtime_engine.begin() as connection:
        with pytest.raises(ProgrammingError) as raised, connection.begin_nested():
            connection.execute(
                text(
                    "WITH faked AS (UPDATE request SET simulation = true WHERE id = :request)"
                    " UPDATE execution SET simulation = true WHERE request_id = :request"
                ),
                {"request": history.request_id},
            )
        connection.execute(PURGE)
    assert getattr(raised.value.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE
    assert _intact(owner_engine, history)


def test_a_temporary_table_does_not_steer_the_purge(
    runtime_engine: Engine, owner_engine: Engine, history: History
) -> None:
    # (b) A simulated request due for the purge, with no execution: the bait. Migrated
    # databases give no temporary tables to the runtime role (test_temporary_tables.py);
    # one that grants them by hand still does not steer the purge.
    with owner_engine.begin() as connection:
        bait = _request(connection, _flow(connection), simulation=True)
        database = connection.execute(text("SELECT current_database()")).scalar_one()
        connection.execute(text(f'GRANT TEMPORARY ON DATABASE "{database}" TO {RUNTIME_ROLE}'))
    with runtime_engine.begin() as connection:
        # pg_temp came first for tables in the function's search_path: this `execution`
        # claimed the real execution for the bait.
        connection.execute(
            text(
                "CREATE TEMPORARY TABLE execution"
                " (id uuid, request_id uuid, simulation boolean, finished_at timestamptz)"
            )
        )
        connection.execute(text("GRANT ALL ON TABLE pg_temp.execution TO PUBLIC"))
        connection.execute(
            text("INSERT INTO pg_temp.execution VALUES (:real, :bait, true, now())"),
            {"real": history.execution_id, "bait": bait},
        )
        purged = connection.execute(PURGE).scalar_one()
    assert _intact(owner_engine, history)
    assert purged == 1  # the bait itself, a genuine dry run's request, is due


def test_an_overload_in_a_writable_schema_does_not_hijack_the_purge(
    runtime_engine: Engine, owner_engine: Engine, history: History
) -> None:
    # (c) Before PostgreSQL 15 every role may create in public; this server is newer.
    with owner_engine.begin() as connection:
        connection.execute(text(f"GRANT CREATE ON SCHEMA public TO {RUNTIME_ROLE}"))
    with runtime_engine.begin() as connection:
        # A better match for cardinality(uuid[]) than pg_catalog's cardinality(anyarray):
        # called by the purge, it would run with the owner's rights.
        connection.execute(
            text(
                "CREATE FUNCTION public.cardinality(uuid[]) RETURNS integer LANGUAGE sql AS"
                " 'DELETE FROM public.action_attempt; DELETE FROM public.action_execution;"
                " SELECT -1'"
            )
        )
        purged = connection.execute(PURGE).scalar_one()
    assert purged == 0
    assert _intact(owner_engine, history)


@pytest.fixture
def platform_dsn(database: TestDatabase, pg_server: TestServer) -> Iterator[str]:
    ensure_role(pg_server, PLATFORM_ROLE, PLATFORM_PASSWORD)
    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role=PLATFORM_ROLE)
    url = database.owner_url.set(
        drivername="postgresql", username=PLATFORM_ROLE, password=PLATFORM_PASSWORD
    )
    yield url.render_as_string(hide_password=False)


@pytest.mark.parametrize(
    "call",
    [
        f"SELECT {WRITE_BATCH_FUNCTION}(NULL, NULL, NULL, NULL, NULL, 'x')",
        f"SELECT {PURGE_SIMULATIONS_FUNCTION}(interval '0', 1)",
    ],
)
def test_no_other_role_may_run_the_project_functions(platform_dsn: str, call: str) -> None:
    with (
        psycopg.connect(platform_dsn) as connection,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"),
    ):
        connection.execute(call)


@pytest.mark.parametrize(
    "change",
    [
        "output = '{\"charged\": 0}'",
        "status = 'FAILED', error_code = 'RETRY_APPROVED', attempt_base = attempt",
        "status = 'UNKNOWN'",
    ],
)
def test_a_succeeded_checkpoint_keeps_its_status_and_output(
    runtime_engine: Engine, owner_engine: Engine, history: History, change: str
) -> None:
    # The protocol's column grants cover both (a step's success writes them), so only a
    # trigger stops a rewrite: later steps and the decision read the output, and a
    # checkpoint no longer SUCCEEDED would run its payment again.
    with (
        pytest.raises(ProgrammingError) as refused,
        runtime_engine.begin() as connection,
    ):
        connection.execute(
            text(f"UPDATE action_execution SET {change} WHERE execution_id = :id"),
            {"id": history.execution_id},
        )
    assert getattr(refused.value.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE
    assert "succeeded checkpoint" in str(refused.value.orig)
    with owner_engine.connect() as connection:
        kept = connection.execute(
            text("SELECT status, output FROM action_execution WHERE execution_id = :id"),
            {"id": history.execution_id},
        ).one()
    assert tuple(kept) == ("SUCCEEDED", None)


def test_only_a_retry_of_the_step_a_contract_mismatch_names_may_undo_its_success(
    runtime_engine: Engine, owner_engine: Engine, history: History
) -> None:
    # The operator's retry of a step recorded for another contract runs it as new: the
    # one way back from SUCCEEDED, and only for the step the parked execution names.
    retry = text(
        "UPDATE action_execution SET status = 'FAILED', error_code = 'RETRY_APPROVED'"
        " WHERE execution_id = :id AND action_id = 'charge'"
    )
    park = text(
        "UPDATE execution SET status = 'RECONCILIATION_REQUIRED', finished_at = NULL,"
        " error_code = :reason, error_detail = CAST(:detail AS jsonb)"
        " WHERE id = :id"
    )
    for reason, named in (("CONTRACT_MISMATCH", "other"), ("WRITE_IN_DOUBT", "charge")):
        with owner_engine.begin() as connection:
            connection.execute(
                park,
                {
                    "id": history.execution_id,
                    "reason": reason,
                    "detail": f'{{"actionId": "{named}"}}',
                },
            )
        with pytest.raises(ProgrammingError), runtime_engine.begin() as connection:
            connection.execute(retry, {"id": history.execution_id})

    with owner_engine.begin() as connection:
        connection.execute(
            park,
            {
                "id": history.execution_id,
                "reason": "CONTRACT_MISMATCH",
                "detail": '{"actionId": "charge"}',
            },
        )
    with runtime_engine.begin() as connection:
        assert connection.execute(retry, {"id": history.execution_id}).rowcount == 1
