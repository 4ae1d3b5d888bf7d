"""The history's months ahead and its retention by outcome, run by the maintenance leader."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from orquestador.history.retention import make_months_ahead, purge_history
from orquestador.worker.maintenance import MaintenanceLoop, PassReport
from tests.integration.worker_support import (
    ORG,
    accept_transition,
    create_request,
    flow_definition,
    publish_flow,
    settings,
)

# Months reach back this far, so the oldest ones are past the longer period (365 days).
OLDEST_DAYS = 520


def _months_back(
    owner: Engine, tables: tuple[str, ...] = ("audit_event", "action_attempt")
) -> None:
    """Monthly partitions back to OLDEST_DAYS ago, as a database that ran for long has."""
    with owner.begin() as conn:
        for table in tables:
            conn.execute(
                text(
                    "SELECT orquestador_history_month(:table, month::date)"
                    " FROM generate_series(date_trunc('month', (now() - make_interval("
                    " days => :days)) AT TIME ZONE 'UTC'), now(), interval '1 month') month"
                ),
                {"table": table, "days": OLDEST_DAYS},
            )


def _execution(owner: Engine, status: str, finished_days_ago: float | None) -> uuid.UUID:
    flow_id = publish_flow(owner, flow_definition([]))
    execution_id = accept_transition(owner, create_request(owner, flow_id))
    with owner.begin() as conn:
        # The acceptance's own audit row is written now: this history starts earlier.
        conn.execute(text("DELETE FROM audit_event WHERE execution_id = :id"), {"id": execution_id})
        conn.execute(
            text(
                "UPDATE execution SET status = :status,"
                " finished_at = now() - make_interval(days => :days) WHERE id = :id"
            ),
            {"status": status, "days": finished_days_ago, "id": execution_id},
        )
        conn.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " VALUES (:id, 'a', 'FAILED', 2, 1, 'h', :key, 'READ_ONLY', 'test.read', 1)"
            ),
            {"id": execution_id, "key": f"{execution_id}:a"},
        )
    return execution_id


def _history(owner: Engine, execution_id: uuid.UUID | None, days_ago: float) -> None:
    """An audit row and (for an execution) an attempt, written DAYS_AGO."""
    with owner.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, execution_id, created_at)"
                " VALUES (:org, 'K', :id, now() - make_interval(days => :days))"
            ),
            {"org": ORG, "id": execution_id, "days": days_ago},
        )
        if execution_id is not None:
            conn.execute(
                text(
                    "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                    " status, started_at) SELECT :id, 'a', coalesce(max(attempt), 0) + 1, 1,"
                    " 'FAILED', now() - make_interval(days => :days)"
                    " FROM action_attempt WHERE execution_id = :id"
                ),
                {"id": execution_id, "days": days_ago},
            )


def _rows(owner: Engine, execution_id: uuid.UUID) -> tuple[int, int]:
    with owner.connect() as conn:
        audit = conn.execute(
            text("SELECT count(*) FROM audit_event WHERE execution_id = :id"), {"id": execution_id}
        ).scalar_one()
        attempts = conn.execute(
            text("SELECT count(*) FROM action_attempt WHERE execution_id = :id"),
            {"id": execution_id},
        ).scalar_one()
    return audit, attempts


def _partitions(owner: Engine, table: str) -> set[str]:
    with owner.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = CAST(:table AS regclass)"
                ),
                {"table": table},
            ).scalars()
        )


def _one_pass(engine: Engine, **retention: int) -> PassReport:
    reports: list[PassReport] = []
    loop = MaintenanceLoop(settings(**retention), engine, "w-test", on_pass=reports.append)
    try:
        loop.run_once()
    finally:
        loop.lock.release()
    (report,) = reports
    return report


def test_retention_by_outcome_never_touches_an_unended_or_parked_execution(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    _months_back(owner_engine)
    succeeded_old = _execution(owner_engine, "SUCCEEDED", 100)
    cancelled_old = _execution(owner_engine, "CANCELLED", 100)
    succeeded_recent = _execution(owner_engine, "SUCCEEDED", 30)
    failed_within = _execution(owner_engine, "FAILED", 100)
    failed_old = _execution(owner_engine, "FAILED", 400)
    parked = _execution(owner_engine, "RECONCILIATION_REQUIRED", None)
    pending = _execution(owner_engine, "PENDING", None)
    for execution_id, days in (
        (succeeded_old, 110),
        (cancelled_old, 110),
        (succeeded_recent, 35),
        (failed_within, 110),
        (failed_old, 450),
        (parked, OLDEST_DAYS - 10),
        (parked, 5),
        (pending, OLDEST_DAYS - 10),
        (pending, 100),
    ):
        _history(owner_engine, execution_id, days)
    _history(owner_engine, None, OLDEST_DAYS - 10)  # no execution: goes with its month
    _history(owner_engine, None, 10)
    months_before = _partitions(owner_engine, "audit_event")

    # One month a table a pass is dropped whole: a few passes drain the old months.
    deleted = sum(_one_pass(runtime_engine).deleted["audit_event"] for _ in range(8))

    assert _rows(owner_engine, succeeded_old) == (0, 0)
    assert _rows(owner_engine, cancelled_old) == (0, 0)
    assert _rows(owner_engine, failed_old) == (0, 0)
    assert _rows(owner_engine, succeeded_recent) == (1, 1)
    assert _rows(owner_engine, failed_within) == (1, 1)
    assert _rows(owner_engine, parked) == (2, 2)
    assert _rows(owner_engine, pending) == (2, 2)
    # Row by row: the two ended 100 days ago, and the failed one (its month is not the
    # oldest, so the first pass reaches its rows before the month goes).
    assert deleted == 6
    with owner_engine.connect() as conn:
        unowned = conn.execute(
            text("SELECT count(*) FROM audit_event WHERE execution_id IS NULL")
        ).scalar_one()
        # The parked and pending executions' old rows outlived their months.
        moved = conn.execute(
            text("SELECT count(*) FROM audit_event_default WHERE execution_id = ANY(:ids)"),
            {"ids": [parked, pending]},
        ).scalar_one()
    assert unowned == 1 and moved == 2
    months_after = _partitions(owner_engine, "audit_event")
    dropped = months_before - months_after
    assert dropped and all(name < "audit_event_p" + _month(365) for name in dropped)
    assert {"audit_event_default", "audit_event_p" + _month(0)} <= months_after


def _month(days_ago: int) -> str:
    """The partition suffix of the UTC month DAYS_AGO ago (negative: ahead)."""
    return (datetime.now(UTC) - timedelta(days=days_ago)).strftime("%Y_%m")


def test_months_ahead_are_made_once_and_a_purge_needs_the_function(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    with owner_engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_event_p" + _month(-40)))
    with runtime_engine.begin() as conn:
        assert make_months_ahead(conn) == 1
    with runtime_engine.begin() as conn:
        assert make_months_ahead(conn) == 0
    assert "audit_event_p" + _month(-40) in _partitions(owner_engine, "audit_event")
    with pytest.raises(ValueError), runtime_engine.begin() as conn:
        purge_history(conn, 90, 365, 0)
    # The runtime role has no way around the functions: no DDL on the history.
    with pytest.raises(ProgrammingError), runtime_engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_event_p" + _month(0)))


def test_the_leaders_pass_makes_a_missing_month_ahead_of_both_tables(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    ahead = _month(-40)
    with owner_engine.begin() as conn:
        conn.execute(text(f"DROP TABLE audit_event_p{ahead}, action_attempt_p{ahead}"))
    # The pass runs as the product does: the runtime role, holding the leader's lock.
    assert _one_pass(runtime_engine).history_months_made == 2
    assert "audit_event_p" + ahead in _partitions(owner_engine, "audit_event")
    assert "action_attempt_p" + ahead in _partitions(owner_engine, "action_attempt")
    assert _one_pass(runtime_engine).history_months_made == 0
