"""A RUNNING checkpoint before the call only where the write rule needs it (SPEC 28).

A non-idempotent write's RUNNING checkpoint is durable before its call, always. A read,
and an idempotent write with nothing held back, write their attempt when it ends; a
crash during one is recalled by the next holder as the interrupted attempt it was, under
the same external key, and the execution's record says which attempt was cut short.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.actions import Effect, TransientError
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    SimulatedCrash,
    action,
    attempt_history,
    audit,
    checkpoints,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    make_due,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)


def _history(engine: Engine, execution_id: Any, action_id: str) -> list[tuple[Any, ...]]:
    return [
        (row.attempt, row.status, row.error_code)
        for row in attempt_history(engine, execution_id, action_id)
    ]


def _crash_then_recover(engine: Engine, eid: Any, *doubles: Double, at: str) -> str:
    """Run the execution until the adapter of step `at` returns, die there, let the lease
    run out, and run it again in a new holder; the new holder's end status."""

    def crash_after(claim: Any, action_id: str) -> None:
        if action_id == at:
            crash_at_hook()

    crashing = Executor(registry_of(*doubles), settings(), WorkerHooks(after_adapter=crash_after))
    with pytest.raises(SimulatedCrash):
        run_once(engine, crashing, "crashed")
    expire_lease(engine, eid)
    return run_once(engine, Executor(registry_of(*doubles), settings()), "recovering")


def test_a_safe_step_writes_its_whole_attempt_when_it_ends(runtime_engine: Engine) -> None:
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    seen: list[dict[str, Any]] = []

    def before(claim: Any, action_id: str) -> None:  # another connection: what committed
        seen.append(dict(checkpoints(runtime_engine, claim.execution_id)))

    executor = Executor(registry_of(write), settings(), WorkerHooks(before_adapter=before))
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert seen == [{}]  # nothing was written before the call
    row = checkpoints(runtime_engine, eid)["w"]
    assert (row.status, row.attempt, row.external_key) == ("SUCCEEDED", 1, f"{eid}:w")
    assert row.first_started_at is not None and row.started_at <= row.finished_at
    assert _history(runtime_engine, eid, "w") == [(1, "SUCCEEDED", None)]
    # One write through the writer: the finish, with the step's attempt riding in it.
    assert executor.writer_stats().rows == 1
    executor.close()


def test_an_idempotent_step_rerun_after_a_crash_uses_the_same_external_key(
    runtime_engine: Engine,
) -> None:
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))

    assert _crash_then_recover(runtime_engine, eid, write, at="w") == "SUCCEEDED"

    # Both calls under one key, derived from the execution and the action.
    assert [ctx.external_key for ctx in write.calls] == [f"{eid}:w", f"{eid}:w"]
    assert [ctx.attempt for ctx in write.calls] == [1, 2]
    # The cut-short attempt is recalled: in doubt (UNKNOWN), numbered, never lost.
    assert _history(runtime_engine, eid, "w") == [
        (1, "UNKNOWN", "INTERRUPTED"),
        (2, "SUCCEEDED", None),
    ]
    (interrupted,) = audit(runtime_engine, eid, "ATTEMPT_INTERRUPTED")
    assert interrupted.detail["attempt"] == 1
    assert execution(runtime_engine, eid).attempts == 2


def test_an_interrupted_idempotent_write_out_of_attempts_stays_in_doubt(
    runtime_engine: Engine,
) -> None:
    # No look-up: nothing can tell whether the crashed call wrote, so the request is
    # never released as if it had not.
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=1)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))

    assert _crash_then_recover(runtime_engine, eid, write, at="w") == "RECONCILIATION_REQUIRED"

    assert len(write.calls) == 1
    row = execution(runtime_engine, eid)
    assert row.error_detail["writesInDoubt"] == ["w"]
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid


def test_a_write_after_a_held_back_success_keeps_its_running_checkpoint(
    runtime_engine: Engine,
) -> None:
    read = Double("test.read", Effect.READ_ONLY)
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(
        runtime_engine,
        flow_definition([action("r", "test.read"), action("w", "test.write")]),
    )

    assert _crash_then_recover(runtime_engine, eid, read, write, at="w") == "SUCCEEDED"

    # The read's success rode with the write's RUNNING: durable, not repeated. The write,
    # started with it, was found RUNNING and recorded as interrupted.
    assert len(read.calls) == 1 and len(write.calls) == 2
    assert _history(runtime_engine, eid, "r") == [(1, "SUCCEEDED", None)]
    assert _history(runtime_engine, eid, "w") == [
        (1, "UNKNOWN", "INTERRUPTED"),
        (2, "SUCCEEDED", None),
    ]


def test_a_non_idempotent_write_never_runs_without_its_running_checkpoint(
    runtime_engine: Engine,
) -> None:
    pay = Double("test.pay", Effect.NON_IDEMPOTENT_WRITE)
    seen: list[str] = []

    def before(claim: Any, action_id: str) -> None:  # another connection: what committed
        seen.append(checkpoints(runtime_engine, claim.execution_id)[action_id].status)

    eid = start_execution(runtime_engine, flow_definition([action("pay", "test.pay")]))
    crashing = Executor(
        registry_of(pay),
        settings(),
        WorkerHooks(before_adapter=before, after_adapter=crash_at_hook),
    )
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    assert seen == ["RUNNING"]
    expire_lease(runtime_engine, eid)

    status = run_once(runtime_engine, Executor(registry_of(pay), settings()), "recovering")

    # Found RUNNING: never called again behind anyone's back.
    assert status == "RECONCILIATION_REQUIRED" and len(pay.calls) == 1
    assert execution(runtime_engine, eid).error_code == "INTERRUPTED_NON_IDEMPOTENT_WRITE"


def test_a_read_cut_short_after_a_retry_is_recalled_as_the_next_attempt(
    runtime_engine: Engine,
) -> None:
    def flaky(ctx: Any) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise TransientError("not yet")
        return {"ok": ctx.attempt}

    read = Double("test.read", Effect.READ_ONLY, output=flaky)
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    assert run_once(runtime_engine, Executor(registry_of(read), settings())) == "RETRY_WAIT"
    make_due(runtime_engine, eid)

    assert _crash_then_recover(runtime_engine, eid, read, at="r") == "SUCCEEDED"

    assert [ctx.attempt for ctx in read.calls] == [1, 2, 3]
    assert _history(runtime_engine, eid, "r") == [
        (1, "FAILED", "TRANSIENT"),
        (2, "FAILED", "INTERRUPTED"),
        (3, "SUCCEEDED", None),
    ]
    assert checkpoints(runtime_engine, eid)["r"].output == {"ok": 3}


def test_a_read_after_a_held_back_success_writes_it_with_its_running_first(
    runtime_engine: Engine,
) -> None:
    # Nothing rides past a step that writes nothing before its call: the second read's
    # RUNNING carries the first's success, dated by the database before it, so no
    # recorded end is after the next step's start or before its own call returned.
    first, second = Double("test.first", Effect.READ_ONLY), Double("test.second", Effect.READ_ONLY)
    seen: dict[str, dict[str, Any]] = {}

    def before(claim: Any, action_id: str) -> None:  # another connection: what committed
        seen[action_id] = dict(checkpoints(runtime_engine, claim.execution_id))

    executor = Executor(registry_of(first, second), settings(), WorkerHooks(before_adapter=before))
    start_execution(
        runtime_engine,
        flow_definition([action("a", "test.first"), action("b", "test.second")]),
    )
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert seen["a"] == {}  # the first read wrote nothing before its call
    a, b = seen["b"]["a"], seen["b"]["b"]
    assert (a.status, b.status) == ("SUCCEEDED", "RUNNING")
    assert a.finished_at <= b.started_at
    executor.close()
