"""The history's months ahead and its retention by outcome, run by the maintenance leader."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from orquestador.history.retention import make_months_ahead, purge_history
from orquestador.worker.maintenance import MaintenanceLoop, PassReport
from tests.integration.history_support import (
    OLDEST_DAYS,
    execution_with,
    history_rows,
    month_suffix,
    months_back,
    partitions_of,
    write_history,
)
from tests.integration.worker_support import settings


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
    months_back(owner_engine)
    succeeded_old = execution_with(owner_engine, "SUCCEEDED", 100)
    cancelled_old = execution_with(owner_engine, "CANCELLED", 100)
    succeeded_recent = execution_with(owner_engine, "SUCCEEDED", 30)
    failed_within = execution_with(owner_engine, "FAILED", 100)
    failed_old = execution_with(owner_engine, "FAILED", 400)
    parked = execution_with(owner_engine, "RECONCILIATION_REQUIRED", None)
    pending = execution_with(owner_engine, "PENDING", None)
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
        write_history(owner_engine, execution_id, days)
    write_history(owner_engine, None, OLDEST_DAYS - 10)  # no execution: goes with its month
    write_history(owner_engine, None, 10)
    months_before = partitions_of(owner_engine, "audit_event")

    # One month a table a pass is dropped whole: a few passes drain the old months.
    deleted = sum(_one_pass(runtime_engine).deleted["audit_event"] for _ in range(8))

    assert history_rows(owner_engine, succeeded_old) == (0, 0)
    assert history_rows(owner_engine, cancelled_old) == (0, 0)
    assert history_rows(owner_engine, failed_old) == (0, 0)
    assert history_rows(owner_engine, succeeded_recent) == (1, 1)
    assert history_rows(owner_engine, failed_within) == (1, 1)
    assert history_rows(owner_engine, parked) == (2, 2)
    assert history_rows(owner_engine, pending) == (2, 2)
    # Row by row: the two ended 100 days ago, and the failed one (its month is not the
    # oldest, so the first pass reaches its rows before the month goes); with its month,
    # the row of no execution written as long ago. The count holds both kinds.
    assert deleted == 7
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
    months_after = partitions_of(owner_engine, "audit_event")
    dropped = months_before - months_after
    assert dropped and all(name < "audit_event_p" + month_suffix(365) for name in dropped)
    assert {"audit_event_default", "audit_event_p" + month_suffix(0)} <= months_after


def test_months_ahead_are_made_once_and_a_purge_needs_the_function(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    with owner_engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_event_p" + month_suffix(-40)))
    with runtime_engine.begin() as conn:
        assert make_months_ahead(conn) == 1
    with runtime_engine.begin() as conn:
        assert make_months_ahead(conn) == 0
    assert "audit_event_p" + month_suffix(-40) in partitions_of(owner_engine, "audit_event")
    with pytest.raises(ValueError), runtime_engine.begin() as conn:
        purge_history(conn, 90, 365, 0)
    # The runtime role has no way around the functions: no DDL on the history.
    with pytest.raises(ProgrammingError), runtime_engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_event_p" + month_suffix(0)))


def test_the_leaders_pass_makes_a_missing_month_ahead_of_both_tables(
    owner_engine: Engine, runtime_engine: Engine
) -> None:
    ahead = month_suffix(-40)
    with owner_engine.begin() as conn:
        conn.execute(text(f"DROP TABLE audit_event_p{ahead}, action_attempt_p{ahead}"))
    # The pass runs as the product does: the runtime role, holding the leader's lock.
    assert _one_pass(runtime_engine).history_months_made == 2
    assert "audit_event_p" + ahead in partitions_of(owner_engine, "audit_event")
    assert "action_attempt_p" + ahead in partitions_of(owner_engine, "action_attempt")
    assert _one_pass(runtime_engine).history_months_made == 0


def test_a_setting_below_the_owners_floor_keeps_the_floor_and_says_so(
    owner_engine: Engine, runtime_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    ended = execution_with(owner_engine, "SUCCEEDED", 50)
    write_history(owner_engine, ended, 60)

    with caplog.at_level("WARNING", logger="orquestador.worker.maintenance"):
        report = _one_pass(runtime_engine, history_retention_days=30)

    assert report.deleted["audit_event"] == 0 and history_rows(owner_engine, ended) == (1, 1)
    (line,) = [r.getMessage() for r in caplog.records if "HISTORY_RETENTION_DAYS" in r.getMessage()]
    assert "HISTORY_RETENTION_DAYS=30 is below the 90 days the owner allows" in line
    assert "orquestador migrate grant" in line
