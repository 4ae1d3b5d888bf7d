"""The row locks behind the fence: what keeps a reclaimer out while a holder's write is in
flight, and what a claim locks."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from orquestador.errors import LeaseLost
from orquestador.queue import (
    ActionAttempt,
    claim_round,
    load_execution,
    start_checkpoint,
    succeed_checkpoint,
)
from orquestador.queue.claims import _CLAIM
from tests.integration.worker_support import (
    action,
    claim_one,
    expire_lease,
    flow_definition,
    start_execution,
    wait_until,
)


def _attempt(claim, attempt=1):
    return ActionAttempt(
        action_id="a",
        attempt=attempt,
        input_hash="h",
        external_key=f"{claim.execution_id}:a",
        effect="IDEMPOTENT_WRITE",
        capability="test.write",
        adapter_version=1,
    )


WRITES = {
    "succeed_checkpoint": lambda conn, c: succeed_checkpoint(conn, c, "a", {"done": True}),
    "start_checkpoint": lambda conn, c: start_checkpoint(conn, c, _attempt(c, attempt=2)),
}


def _waiting_on_a_lock(owner_engine) -> bool:
    with owner_engine.connect() as conn:
        return (
            conn.execute(
                text("""SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'""")
            ).scalar_one()
            > 0
        )


def _database_time_passed(engine, moment) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp() > :t"), {"t": moment}).scalar_one()


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_holder_write_in_flight_keeps_a_reclaimer_out_until_it_commits(
    runtime_engine, owner_engine, write
):
    eid = start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    old = claim_one(runtime_engine, "old", lease_seconds=1)
    with runtime_engine.connect() as conn:
        start_checkpoint(conn, old, _attempt(old))

    # A third session holds the checkpoint row: the old holder's statement passes its
    # fence check, locks the execution row, and then waits inside its transaction.
    blocker = owner_engine.connect()
    blocking = blocker.begin()
    blocker.execute(
        text("SELECT 1 FROM action_execution WHERE execution_id = :id FOR UPDATE"), {"id": eid}
    )
    outcome = {}

    def old_holder_writes():
        with runtime_engine.connect() as conn:
            try:
                WRITES[write](conn, old)
                outcome["written"] = True
            except LeaseLost:
                outcome["written"] = False

    thread = threading.Thread(target=old_holder_writes)
    thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the write to be in flight")
        # The lease runs out by database time while the write is still in flight.
        wait_until(
            lambda: _database_time_passed(runtime_engine, old.lease_expires_at),
            what="the lease to expire",
        )
        with runtime_engine.connect() as conn:
            taken = claim_round(conn, "new", limit=1, lease_seconds=30).claims
        # The row lock the write took with its fence check keeps the reclaimer out:
        # without it, a new holder would start while a stale write is about to commit.
        assert taken == []
    finally:
        blocking.rollback()
        blocker.close()
        thread.join(20)
    assert outcome == {"written": True}

    # Once the write committed, the next holder takes over and sees it.
    new = claim_one(runtime_engine, "new")
    assert new.token == old.token + 1
    with runtime_engine.connect() as conn:
        loaded = load_execution(conn, new)
    expected = "SUCCEEDED" if write == "succeed_checkpoint" else "RUNNING"
    assert loaded.checkpoints["a"].status == expected


def _unlocked_executions(engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(text("SELECT id FROM execution FOR UPDATE SKIP LOCKED")).all())


def test_a_claim_locks_no_more_rows_than_it_takes(runtime_engine):
    def start():
        return start_execution(runtime_engine, flow_definition([action("a", "test.write")]))

    abandoned = []
    for _ in range(2):
        eid = start()
        assert claim_one(runtime_engine, "crashed").execution_id == eid
        abandoned.append(eid)
    for eid in abandoned:
        expire_lease(runtime_engine, eid)
    for _ in range(2):
        start()

    # The claim statement inside a transaction left open, so its locks can be counted.
    with runtime_engine.connect() as conn, conn.begin():
        claimed = conn.execute(
            _CLAIM, {"limit": 2, "owner": "w", "lease_seconds": 30.0, "weights": {}}
        ).all()
        assert len(claimed) == 2
        # Lease-expired work goes first; the two pending rows are neither taken nor held.
        assert {row.id for row in claimed} == set(abandoned)
        assert _unlocked_executions(runtime_engine) == 2
