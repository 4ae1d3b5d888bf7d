"""A wait's deadline counts from the step's first start across a SIGKILL and a reclaim."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tests.acceptance.crash_support import read_ledger, spawn_worker
from tests.integration.worker_support import (
    action,
    audit,
    checkpoints,
    execution,
    expire_lease,
    flow_definition,
    start_execution,
    wait_until,
)

DEADLINE_SECONDS = 6.0


def test_sigkill_mid_round_keeps_the_deadline_of_the_first_start(
    database, runtime_engine, processes, tmp_path
):
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    eid = start_execution(
        runtime_engine,
        flow_definition([action("wait", "crash.wait", onError="attention")]),
    )
    victim = spawn_worker(
        database,
        "tests.acceptance.wait_adapters",
        ledger,
        "victim",
        env={"WAIT_DEADLINE_SECONDS": str(DEADLINE_SECONDS)},
        # Above the built-in adapters' timeouts; the test expires the victim's lease itself.
        lease_seconds=12,
        renew_seconds=4,
        concurrency=2,
    )
    processes.append(victim)
    wait_until(
        lambda: any(e["event"] == "blocking" for e in read_ledger(ledger)),
        timeout=60,
        what="the victim blocked in its third round",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert execution(runtime_engine, eid).status == "RUNNING"
    expire_lease(runtime_engine, eid)  # what the passing of time does to a dead holder's lease

    survivor_spawned = datetime.now(UTC)
    survivor = spawn_worker(
        database,
        "tests.acceptance.wait_adapters",
        ledger,
        "survivor",
        env={"WAIT_DEADLINE_SECONDS": str(DEADLINE_SECONDS)},
        # Above the built-in adapters' timeouts; the test expires the victim's lease itself.
        lease_seconds=12,
        renew_seconds=4,
        concurrency=2,
    )
    processes.append(survivor)
    wait_until(
        lambda: execution(runtime_engine, eid).status not in ("RUNNING", "WAITING"),
        timeout=60,
        what="the survivor reached the deadline",
    )

    row = execution(runtime_engine, eid)
    assert (row.status, row.error_code, row.result["toState"]) == (
        "FAILED",
        "WAIT_DEADLINE_EXCEEDED",
        "attention",
    )
    step = checkpoints(runtime_engine, eid)["wait"]
    entries = read_ledger(ledger)
    # Every round of both processes saw the same first start: the database's, written once.
    assert {e["firstStartedAt"] for e in entries} == {step.first_started_at.isoformat()}
    assert "victim" in {e["role"] for e in entries if e["event"] == "round"}
    (deadline,) = [e for e in entries if e["event"] == "deadline"]
    assert deadline["role"] == "survivor"
    # The deadline was not restarted by the reclaim: it ran out one deadline after the
    # first start. Restarted, it would run out one deadline after the survivor took over,
    # which is after the survivor was spawned, however long a loaded machine took to start
    # it (and if that took longer than the deadline, its first round is the deadline).
    hit = datetime.fromisoformat(deadline["at"]) - step.first_started_at
    took_over = survivor_spawned - step.first_started_at
    assert (
        timedelta(seconds=DEADLINE_SECONDS) <= hit < took_over + timedelta(seconds=DEADLINE_SECONDS)
    )
    # Waits spent nothing; the killed round did (one claim, one reclaim).
    assert row.attempts == 2
    with runtime_engine.connect() as conn:
        history = conn.execute(
            text("""SELECT attempt, status, error_code FROM action_attempt
                    WHERE execution_id = :id ORDER BY attempt"""),
            {"id": eid},
        ).all()
    # A read's round writes no checkpoint before its call (SPEC 28): the survivor, taking
    # the execution over, recalled the killed round as the step's interrupted attempt.
    assert [tuple(h) for h in history] == [
        (1, "FAILED", "INTERRUPTED"),
        (2, "FAILED", "WAIT_DEADLINE_EXCEEDED"),
    ]
    # And the execution's record says which of its attempts was cut short.
    (interrupted,) = audit(runtime_engine, eid, "ATTEMPT_INTERRUPTED")
    assert interrupted.detail["attempt"] == 1
    (exit_row,) = audit(runtime_engine, eid, "STEP_ERROR_EXIT")
    assert exit_row.detail["observed"]["wait"]["status"] == "sent"
