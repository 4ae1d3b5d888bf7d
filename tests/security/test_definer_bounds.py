"""The runtime role cannot rewrite history through the SECURITY DEFINER functions it may
call: whatever periods, months and batches it asks for, they stay within the bounds the
owner set at migrate time, and each says how much it did. Every attack runs as the role."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from orquestador.db import migrate
from orquestador.db.bounds import MONTHS_AHEAD, FunctionBounds, read_function_bounds
from tests.db_support import RUNTIME_ROLE, TestDatabase
from tests.integration.history_support import (
    OLDEST_DAYS,
    execution_with,
    history_rows,
    month_suffix,
    months_back,
    partitions_of,
    write_history,
)

ERASE = text(
    "SELECT orquestador_history_purge(interval '-1000 years', interval '-1000 years', 1000000)"
)


def _all_history(owner: Engine) -> tuple[int, int]:
    with owner.connect() as conn:
        audit = conn.execute(text("SELECT count(*) FROM audit_event")).scalar_one()
        attempts = conn.execute(text("SELECT count(*) FROM action_attempt")).scalar_one()
    return audit, attempts


def test_a_negative_period_drops_neither_this_month_nor_the_months_ahead(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    write_history(owner_engine, None, 0)  # a machine's enrolment, say: no execution
    months = partitions_of(owner_engine, "audit_event")
    before = _all_history(owner_engine)

    with runtime_engine.begin() as conn:
        counted = [conn.execute(ERASE).scalar_one() for _ in range(3)]

    assert partitions_of(owner_engine, "audit_event") == months
    assert _all_history(owner_engine) == before and counted == [0, 0, 0]


def test_a_negative_period_erases_nothing_within_the_owners_periods_and_the_count_is_true(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    months_back(owner_engine)
    failed_within = execution_with(owner_engine, "FAILED", 100)  # within its 365 days
    succeeded_within = execution_with(owner_engine, "SUCCEEDED", 30)  # within its 90
    succeeded_past = execution_with(owner_engine, "SUCCEEDED", 100)
    for execution_id, days in ((failed_within, 110), (succeeded_within, 35), (succeeded_past, 110)):
        write_history(owner_engine, execution_id, days)
    # Rows of no execution: a machine's enrolment this month, a sign-in long ago.
    write_history(owner_engine, None, 0)
    write_history(owner_engine, None, OLDEST_DAYS - 10)
    months_before = partitions_of(owner_engine, "audit_event")
    before = _all_history(owner_engine)

    counted = 0
    for _ in range(3):
        with runtime_engine.begin() as conn:
            counted += conn.execute(ERASE).scalar_one()

    assert history_rows(owner_engine, failed_within) == (1, 1)
    assert history_rows(owner_engine, succeeded_within) == (1, 1)
    # What the owner's periods allow does go: the execution past its 90 days, and the
    # oldest month with the old sign-in in it.
    assert history_rows(owner_engine, succeeded_past) == (0, 0)
    after = _all_history(owner_engine)
    assert counted == sum(before) - sum(after) == 3
    kept = partitions_of(owner_engine, "audit_event")
    assert {f"audit_event_p{month_suffix(days)}" for days in (0, -31, -62)} <= kept
    assert all(name < f"audit_event_p{month_suffix(365)}" for name in months_before - kept)


def test_a_thousand_months_ahead_make_no_more_than_the_owners_months(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    beyond = f"audit_event_p{month_suffix(-31 * (MONTHS_AHEAD + 1) - 15)}"
    with runtime_engine.begin() as conn:
        conn.execute(text("SELECT orquestador_history_partitions(1000)"))
        none = conn.execute(text("SELECT orquestador_history_partitions(-5)")).scalar_one()
    made = partitions_of(owner_engine, "audit_event")
    assert beyond not in made and none == 0
    assert len(made) == MONTHS_AHEAD + 2  # this month, the months ahead, DEFAULT


def _dry_runs(owner: Engine, count: int, created_days_ago: int) -> list[uuid.UUID]:
    """Simulated requests that ended, with their simulated executions."""
    with owner.begin() as conn:
        flow_id = conn.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) VALUES ('acme', :key, 1, 'manual', '{}', '{}', 'ana') RETURNING id"
            ),
            {"key": f"f-{uuid.uuid4().hex[:8]}"},
        ).scalar_one()
        ids = []
        for _ in range(count):
            request_id = conn.execute(
                text(
                    "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,"
                    " simulation, created_at) VALUES ('acme', 'ana', :flow, 'new', '{}', 'ana',"
                    " true, now() - make_interval(days => :days)) RETURNING id"
                ),
                {"flow": flow_id, "days": created_days_ago},
            ).scalar_one()
            conn.execute(
                text(
                    "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                    " accepted_revision, accepted_state, actor_snapshot, status, finished_at,"
                    " simulation) VALUES (:request, 'acme', :flow, 'go', 1, 'new', '{}',"
                    " 'SUCCEEDED', now(), true)"
                ),
                {"request": request_id, "flow": flow_id},
            )
            ids.append(request_id)
    return ids


def test_the_simulation_purge_keeps_the_owners_period_and_batch(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    recent = _dry_runs(owner_engine, 1, created_days_ago=2)  # within the owner's 7 days
    old = _dry_runs(owner_engine, 3, created_days_ago=30)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE function_bound SET value = 2 WHERE name = 'retention_batch'"))

    with runtime_engine.begin() as conn:
        purged = conn.execute(
            text("SELECT orquestador_purge_simulations(interval '-1000 years', 1000000)")
        ).scalar_one()

    with owner_engine.connect() as conn:
        left = set(
            conn.execute(
                text("SELECT id FROM request WHERE id = ANY(:ids)"), {"ids": recent + old}
            ).scalars()
        )
    assert purged == 2 and len(left) == 2 and recent[0] in left


def test_the_owner_sets_the_bounds_at_migrate_time_and_the_runtime_role_cannot(
    database: TestDatabase, runtime_engine: Engine
) -> None:
    bounds = FunctionBounds(
        history_retention_days=30, history_retention_failed_days=60, simulation_retention_days=0
    )
    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role="", bounds=bounds)
    with runtime_engine.connect() as conn:
        assert read_function_bounds(conn) == bounds
    for statement in (
        "UPDATE function_bound SET value = 0",
        "DELETE FROM function_bound",
        "INSERT INTO function_bound VALUES ('history_months_ahead_2', 1000)",
    ):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            runtime_engine.begin() as conn,
        ):
            conn.execute(text(statement))
