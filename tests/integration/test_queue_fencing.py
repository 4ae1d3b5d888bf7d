"""Fencing: once an execution is reclaimed, every write of the old holder is refused."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from orquestador.errors import LeaseLost
from orquestador.queue import (
    ActionAttempt,
    CheckpointOutcome,
    Finish,
    exit_on_error,
    fail_execution,
    finish_execution,
    load_execution,
    release_lease,
    require_reconciliation,
    schedule_retry,
    start_checkpoint,
    succeed_checkpoint,
    write_attempt_outcome,
)
from orquestador.queue.waits import park_waiting
from tests.integration.worker_support import (
    action,
    claim_one,
    expire_lease,
    flow_definition,
    start_execution,
)


def _snapshot(engine) -> list:
    with engine.connect() as conn:
        return [
            conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2")).all()
            for table in ("execution", "request", "action_execution", "audit_event")
        ]


def _attempt(claim, action_id: str = "a", attempt: int = 1) -> ActionAttempt:
    return ActionAttempt(
        action_id,
        attempt,
        "h" * 64,
        f"{claim.execution_id}:{action_id}",
        "IDEMPOTENT_WRITE",
        "test.write",
        1,
    )


@pytest.fixture
def reclaimed(runtime_engine):
    """(old claim, new claim): the old holder's lease expired and another worker took over."""
    start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    old = claim_one(runtime_engine, "old")
    with runtime_engine.connect() as conn:
        start_checkpoint(conn, old, _attempt(old))
    expire_lease(runtime_engine, old.execution_id)
    new = claim_one(runtime_engine, "new")
    assert new.token == old.token + 1
    return old, new


def _in_transaction(conn, write):
    with conn.begin():
        write()


STALE_WRITES = {
    "load": lambda conn, c: load_execution(conn, c),
    "start_checkpoint": lambda conn, c: start_checkpoint(conn, c, _attempt(c, attempt=2)),
    "succeed_checkpoint": lambda conn, c: succeed_checkpoint(conn, c, "a", {"late": True}),
    "write_attempt_outcome": lambda conn, c: _in_transaction(
        conn, lambda: write_attempt_outcome(conn, c, CheckpointOutcome("a", "UNKNOWN", "X"))
    ),
    "schedule_retry": lambda conn, c: schedule_retry(
        conn, c, CheckpointOutcome("a", "FAILED", "TRANSIENT"), 1.0, 1
    ),
    "fail_execution": lambda conn, c: fail_execution(conn, c, "BOOM"),
    "require_reconciliation": lambda conn, c: require_reconciliation(conn, c, "WHY"),
    "exit_on_error": lambda conn, c: exit_on_error(
        conn, c, CheckpointOutcome("a", "FAILED", "NOPE"), "attention", ["a"]
    ),
    "park_waiting": lambda conn, c: park_waiting(conn, c, "a", 60.0, "k", {"seen": 1}),
    "succeed_checkpoint_observed": lambda conn, c: succeed_checkpoint(
        conn, c, "a", {"late": True}, {"seen": 1}
    ),
    "succeed_checkpoint_simulated": lambda conn, c: succeed_checkpoint(
        conn, c, "a", {"late": True}, None, {"actionId": "a"}
    ),
    "finish_execution": lambda conn, c: finish_execution(
        conn, c, Finish("done", "DONE", None, [], [], {"late": True})
    ),
    "release_lease": lambda conn, c: (
        (_ for _ in ()).throw(LeaseLost()) if not release_lease(conn, c) else None
    ),
}


@pytest.mark.parametrize("write", sorted(STALE_WRITES))
def test_a_reclaimed_holder_can_no_longer_write(runtime_engine, reclaimed, write):
    old, _new = reclaimed
    before = _snapshot(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        STALE_WRITES[write](conn, old)
    assert _snapshot(runtime_engine) == before


def test_an_expired_holder_cannot_write_even_before_anyone_reclaims(runtime_engine):
    start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    claim = claim_one(runtime_engine, "w1")
    expire_lease(runtime_engine, claim.execution_id)
    before = _snapshot(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        start_checkpoint(conn, claim, _attempt(claim))
    assert _snapshot(runtime_engine) == before


def test_the_new_holder_writes_normally(runtime_engine, reclaimed):
    _old, new = reclaimed
    with runtime_engine.connect() as conn:
        loaded = load_execution(conn, new)
        assert loaded.checkpoints["a"].status == "RUNNING"
        start_checkpoint(conn, new, _attempt(new, attempt=2))
        succeed_checkpoint(conn, new, "a", {"ok": 1})
        finish_execution(conn, new, Finish("done", "DONE", None, [], ["a"], {"x": 1}))
    with runtime_engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, fencing_token, attempt, output FROM action_execution")
        ).one()
    assert tuple(row) == ("SUCCEEDED", new.token, 2, {"ok": 1})
