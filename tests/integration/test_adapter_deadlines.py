"""Adapter timeouts are enforced: at the deadline the job stops waiting and records the
outcome as uncertain; the call's stop signal is set; a late return writes nothing."""

from __future__ import annotations

import threading

import pytest

from orquestador.actions import Effect
from orquestador.worker.executor import Executor
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    attempt_history,
    checkpoints,
    execution,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)

# What each effect's overrun becomes when the call is still running after the grace: a
# read is simply retried; a write may still land, so it goes to an operator.
OVERRUN = {
    Effect.READ_ONLY: ("RETRY_WAIT", "FAILED"),
    Effect.IDEMPOTENT_WRITE: ("RECONCILIATION_REQUIRED", "UNKNOWN"),
    Effect.NON_IDEMPOTENT_WRITE: ("RECONCILIATION_REQUIRED", "UNKNOWN"),
}


@pytest.mark.parametrize("effect", list(OVERRUN), ids=lambda e: e.value)
def test_an_overrunning_adapter_is_abandoned_at_its_deadline(runtime_engine, effect):
    release = threading.Event()
    returned = threading.Event()
    seen = {}

    def ignores_its_deadline(ctx):
        # A non-cooperative adapter: it only returns when the test lets it.
        release.wait(30)
        seen["should_stop"] = ctx.should_stop()
        returned.set()
        return {"late": True}

    slow = Double("test.slow", effect, timeout_seconds=0.3, output=ignores_its_deadline)
    eid = start_execution(runtime_engine, flow_definition([action("s", "test.slow")]))

    executor = Executor(registry_of(slow), settings(adapter_abandon_grace_seconds=0.3))
    status = run_once(runtime_engine, executor)

    # The run ended while the call was still blocked: the job did not wait for it longer
    # than the grace.
    assert not returned.is_set()
    expected_status, checkpoint_status = OVERRUN[effect]
    assert status == expected_status
    assert execution(runtime_engine, eid).status == expected_status
    # Retried or parked, the request stays held, in its accepted state, data untouched.
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id, request.data) == ("new", eid, {})

    release.set()
    assert returned.wait(10)
    assert seen["should_stop"] is True  # the call's stop signal was set
    # The late answer changed nothing.
    checkpoint = checkpoints(runtime_engine, eid)["s"]
    assert (checkpoint.status, checkpoint.error_code, checkpoint.output) == (
        checkpoint_status,
        "ADAPTER_TIMEOUT",
        None,
    )
    (attempt,) = attempt_history(runtime_engine, eid, "s")
    assert (attempt.status, attempt.error_code) == (checkpoint_status, "ADAPTER_TIMEOUT")
    assert execution(runtime_engine, eid).status == expected_status


def test_a_cooperative_adapter_sees_its_deadline_through_should_stop(runtime_engine):
    stopped = threading.Event()

    def polls_should_stop(ctx):
        while not ctx.should_stop():
            ctx.stop_event.wait(0.01)
        stopped.set()
        return {"partial": True}

    slow = Double(
        "test.slow", Effect.READ_ONLY, timeout_seconds=0.2, max_attempts=1, output=polls_should_stop
    )
    eid = start_execution(runtime_engine, flow_definition([action("s", "test.slow")]))
    assert run_once(runtime_engine, Executor(registry_of(slow), settings())) == "FAILED"
    assert stopped.wait(10)
    assert execution(runtime_engine, eid).error_code == "RETRIES_EXHAUSTED"
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("new", None)  # a read: released


def test_a_timed_out_write_is_handed_on_only_once_its_call_ended(runtime_engine):
    # Regression: the retry of a timed-out idempotent write was scheduled while its call
    # still ran; another worker took the retry, its look-up said NotFound, and the
    # execution ended FAILED with the request released as the first write landed.
    writes: list[str] = []
    on_its_way = threading.Event()  # never set: the request takes its time to leave

    def lands_late(ctx):
        ctx.stop_event.wait(30)  # abandoned at its deadline
        on_its_way.wait(1.0)  # the write lands a second later
        writes.append(ctx.external_key)
        return {"late": True}

    slow = Double("test.slow", Effect.IDEMPOTENT_WRITE, timeout_seconds=0.3, output=lands_late)
    eid = start_execution(runtime_engine, flow_definition([action("s", "test.slow")]))

    status = run_once(runtime_engine, Executor(registry_of(slow), settings()))

    # Retried, but only once the abandoned call had ended: its write is in, and the next
    # attempt (in any worker) runs knowing nothing of this one is still in flight.
    assert status == "RETRY_WAIT" and writes == [f"{eid}:s"]
    checkpoint = checkpoints(runtime_engine, eid)["s"]
    assert (checkpoint.status, checkpoint.error_code) == ("UNKNOWN", "ADAPTER_TIMEOUT")


def test_an_inline_adapter_runs_on_the_job_thread_and_is_late_past_its_deadline(runtime_engine):
    threads = []

    def overruns(ctx):
        threads.append(threading.current_thread())
        while not ctx.should_stop():  # an inline adapter that overruns, cooperatively
            pass
        return {"late": True}

    slow = Double(
        "test.inline", Effect.READ_ONLY, timeout_seconds=0.2, output=overruns, inline=True
    )
    eid = start_execution(runtime_engine, flow_definition([action("s", "test.inline")]))

    status = run_once(runtime_engine, Executor(registry_of(slow), settings()))

    # Called by the job itself, not handed to a call thread; its late answer is not kept.
    (thread,) = threads
    assert not thread.name.startswith("orquestador-call-")
    assert status == "RETRY_WAIT"
    checkpoint = checkpoints(runtime_engine, eid)["s"]
    assert (checkpoint.status, checkpoint.error_code, checkpoint.output) == (
        "FAILED",
        "ADAPTER_TIMEOUT",
        None,
    )
    # Waiting for its retry, the request stays held in its accepted state, data untouched.
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id, request.data) == ("new", eid, {})
