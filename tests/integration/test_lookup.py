"""An adapter's lookup settles a write in doubt before anyone is asked to.

Found: the step SUCCEEDED with the provider's output, audited RECONCILED_BY_LOOKUP,
and the run goes on without calling the adapter again. NotFound: the attempt did not
happen, so the next one is safe within the budget (and the write rule stops counting
it). Unknown, an error or no answer by the lookup's own timeout: parked as before.
Every write a lookup leads to is fenced like any holder write.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    Found,
    NotFound,
    TransientError,
    UncertainError,
    Unknown,
)
from orquestador.errors import ConfigError
from orquestador.worker.executor import LEASE_LOST, Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    SimulatedCrash,
    action,
    attempt_history,
    audit,
    checkpoints,
    claim_one,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    lapse_earlier_calls,
    make_due,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
    wait_until,
)

CHARGE_OUTPUT = {"type": "object", "required": ["chargeId"]}
FOUND_MESSAGE = "found by lookup: the provider has this write under the external key"
NOT_FOUND_NOTE = "lookup: the provider has no write under the external key"


@dataclass
class Lookup:
    """A lookup double: answers as the test says and keeps every context it was given."""

    answer: Callable[[ActionContext], Any]
    calls: list[ActionContext] = field(default_factory=list)

    def __call__(self, ctx: ActionContext) -> Any:
        self.calls.append(ctx)
        return self.answer(ctx)


def answers(result: Any) -> Lookup:
    return Lookup(lambda ctx: result)


def _charge(output: Any, max_attempts: int = 3, effect=Effect.NON_IDEMPOTENT_WRITE) -> Double:
    return Double(
        "test.charge",
        effect,
        max_attempts=max_attempts,
        output=output,
        output_schema=CHARGE_OUTPUT,
    )


def _with_lookup(double: Double, lookup: Lookup, **extra: Any) -> Adapter:
    return dataclasses.replace(double.adapter(), lookup=lookup, **extra)


def _executor(*adapters: Adapter, hooks: WorkerHooks | None = None, **overrides: Any) -> Executor:
    registry = AdapterRegistry()
    for adapter in adapters:
        registry.add(adapter)
    values = {"retry_base_seconds": 0.001, "retry_cap_seconds": 0.001, **overrides}
    return Executor(registry, settings(**values), hooks or WorkerHooks())


def _charge_flow() -> dict[str, Any]:
    return flow_definition([action("charge", "test.charge", input={"amount": {"const": 42}})])


def _lookups_audited(engine, eid) -> list[dict[str, Any]]:
    return [row.detail for row in audit(engine, eid, "RECONCILED_BY_LOOKUP")]


def _history(engine, eid, action_id="charge") -> list[tuple[int, str, str | None]]:
    return [(t.attempt, t.status, t.error_code) for t in attempt_history(engine, eid, action_id)]


# --- Found ------------------------------------------------------------------------------


def test_found_after_an_uncertain_non_idempotent_write_continues_without_a_second_call(
    runtime_engine,
):
    charge = _charge(scripted(UncertainError("connection reset after sending")))
    lookup = answers(Found({"chargeId": "ch-1"}))
    receipt = Double("test.receipt", Effect.IDEMPOTENT_WRITE, output={"sent": True})
    definition = flow_definition(
        [
            action("charge", "test.charge", input={"amount": {"const": 42}}),
            action(
                "receipt", "test.receipt", input={"charge": {"from": "/actions/charge/chargeId"}}
            ),
        ],
        updates=[{"path": "/chargeId", "from": "/actions/charge/chargeId"}],
    )
    eid = start_execution(runtime_engine, definition)

    status = run_once(runtime_engine, _executor(_with_lookup(charge, lookup), receipt.adapter()))

    assert status == "SUCCEEDED"
    assert len(charge.calls) == 1, "the write was made again"
    # The lookup asked about the same write: same key, same inputs, same attempt.
    (asked,) = lookup.calls
    (called,) = charge.calls
    assert (asked.external_key, asked.inputs, asked.attempt) == (f"{eid}:charge", {"amount": 42}, 1)
    assert (asked.external_key, asked.inputs) == (called.external_key, called.inputs)
    assert asked.identity == called.identity
    # Later actions map from the found output, and so does the request.
    assert [c.inputs for c in receipt.calls] == [{"charge": "ch-1"}]
    row = execution(runtime_engine, eid)
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.busy_execution_id, request.data) == (
        "done",
        None,
        {"chargeId": "ch-1"},
    )
    checkpoint = checkpoints(runtime_engine, eid)["charge"]
    assert (checkpoint.status, checkpoint.output, checkpoint.error_code) == (
        "SUCCEEDED",
        {"chargeId": "ch-1"},
        None,
    )
    (line,) = attempt_history(runtime_engine, eid, "charge")
    assert (line.attempt, line.status, line.message) == (1, "SUCCEEDED", FOUND_MESSAGE)
    assert line.finished_at is not None  # this holder saw the call end
    # Which step and key, never the output values.
    assert _lookups_audited(runtime_engine, eid) == [
        {"actionId": "charge", "attempt": 1, "externalKey": f"{eid}:charge"}
    ]
    assert audit(runtime_engine, eid, "TRANSITION_COMPLETED")
    assert not audit(runtime_engine, eid, "RECONCILIATION_REQUIRED")


def test_found_after_a_crash_mid_call_is_recorded_and_the_run_continues(runtime_engine):
    charge = _charge({"chargeId": "ch-2"})
    lookup = answers(Found({"chargeId": "ch-2"}))
    eid = start_execution(runtime_engine, _charge_flow())
    crashing = _executor(charge.adapter(), hooks=WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    assert checkpoints(runtime_engine, eid)["charge"].status == "RUNNING"
    expire_lease(runtime_engine, eid)

    status = run_once(runtime_engine, _executor(_with_lookup(charge, lookup)), "recovering")

    assert status == "SUCCEEDED"
    assert len(charge.calls) == 1
    assert [c.attempt for c in lookup.calls] == [1]
    (line,) = attempt_history(runtime_engine, eid, "charge")
    assert (line.attempt, line.fencing_token, line.status) == (1, 1, "SUCCEEDED")
    assert line.finished_at is None  # left RUNNING by the crashed holder: nobody saw it end
    assert _lookups_audited(runtime_engine, eid) == [
        {"actionId": "charge", "attempt": 1, "externalKey": f"{eid}:charge"}
    ]
    assert request_row(runtime_engine, execution(runtime_engine, eid).request_id).state == "done"


@dataclass
class LateWrite:
    """A write whose request leaves the process a moment after the adapter's deadline.

    The call ignores its deadline until the engine abandons it (its stop signal), then
    its request still takes a moment to reach the provider: unless someone asks the
    provider first, in which case it lands right after that question. A provider
    asked while the call is in flight truthfully answers NotFound.
    """

    writes: list[str] = field(default_factory=list)  # the provider's ledger, by key
    asked: threading.Event = field(default_factory=threading.Event)

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.stop_event.wait(30)  # abandoned at its deadline
        self.asked.wait(1.0)  # the request is still on its way out
        self.writes.append(ctx.external_key)
        return {"chargeId": f"ch-{len(self.writes)}"}

    def lookup(self, ctx: ActionContext) -> Any:
        self.asked.set()
        count = self.writes.count(ctx.external_key)
        return Found({"chargeId": f"ch-{count}"}) if count else NotFound()


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_an_overrun_write_is_looked_up_only_once_its_call_ended(runtime_engine, max_attempts):
    # Regression: the lookup was asked while the abandoned call still ran; the provider
    # said NotFound, and the next attempt wrote again (or, with no attempt left, the
    # execution ended FAILED and released the request) while the first write landed.
    provider = LateWrite()
    charge = Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        timeout_seconds=0.3,
        max_attempts=max_attempts,
        output=provider.invoke,
        output_schema=CHARGE_OUTPUT,
    )
    lookup = Lookup(provider.lookup)
    eid = start_execution(runtime_engine, _charge_flow())

    status = run_once(runtime_engine, _executor(_with_lookup(charge, lookup)))

    assert status == "SUCCEEDED"
    assert provider.writes == [f"{eid}:charge"]  # one write, found once it had landed
    (asked,) = lookup.calls
    assert not asked.should_stop(), "the lookup began with the abandoned call's stop signal"
    assert checkpoints(runtime_engine, eid)["charge"].output == {"chargeId": "ch-1"}
    assert _history(runtime_engine, eid) == [(1, "SUCCEEDED", None)]
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("done", None)


def test_an_abandoned_call_still_running_past_the_grace_parks_its_write(runtime_engine):
    release = threading.Event()

    def never_leaves(ctx: ActionContext) -> dict[str, Any]:
        release.wait(30)
        return {"chargeId": "late"}

    charge = _charge(never_leaves, max_attempts=1)
    charge.timeout_seconds = 0.3
    lookup = answers(NotFound())
    eid = start_execution(runtime_engine, _charge_flow())
    executor = _executor(_with_lookup(charge, lookup), adapter_abandon_grace_seconds=0.3)
    try:
        status = run_once(runtime_engine, executor)
    finally:
        release.set()

    # Never FAILED with the request released while the write may still land: parked,
    # and the provider was not asked (its NotFound could not be trusted).
    assert status == "RECONCILIATION_REQUIRED" and lookup.calls == []
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail["lookup"]) == ("UNCERTAIN_OUTCOME", "IN_FLIGHT")
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.busy_execution_id) == ("new", eid)


def test_a_reclaim_in_the_same_worker_does_not_look_up_while_the_old_call_lingers(
    runtime_engine,
):
    # The job that abandoned the call lost its lease while it waited for the call to
    # end; the same worker reclaims the execution and finds the write interrupted. Its
    # look-up must wait for the old call too: asked now, the provider says NotFound.
    release = threading.Event()

    def never_leaves(ctx: ActionContext) -> dict[str, Any]:
        release.wait(30)
        return {"chargeId": "late"}

    charge = _charge(never_leaves, max_attempts=3)
    charge.timeout_seconds = 0.2
    lookup = answers(NotFound())
    eid = start_execution(runtime_engine, _charge_flow())
    executor = _executor(_with_lookup(charge, lookup), adapter_abandon_grace_seconds=1.5)
    key = f"{eid}:charge"
    first: dict[str, str] = {}
    try:
        job = threading.Thread(
            target=lambda: first.update(status=run_once(runtime_engine, executor))
        )
        job.start()
        wait_until(lambda: executor.calls.lingering(key), what="the call abandoned")
        expire_lease(runtime_engine, eid)
        again = claim_one(runtime_engine, "w2")
        with runtime_engine.connect() as conn:
            status = executor.run(conn, again)
        job.join(10)
    finally:
        release.set()
    assert first["status"] == LEASE_LOST  # the first job could write nothing after it
    assert status == "RECONCILIATION_REQUIRED" and lookup.calls == []
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail["lookup"]) == (
        "INTERRUPTED_NON_IDEMPOTENT_WRITE",
        "IN_FLIGHT",
    )
    assert len(charge.calls) == 1, "the write was tried again while the first could land"


# --- NotFound ---------------------------------------------------------------------------


def test_not_found_after_an_uncertain_write_retries_it_with_the_same_key(runtime_engine):
    charge = _charge(scripted(UncertainError("no answer"), {"chargeId": "ch-3"}))
    lookup = answers(NotFound())
    executor = _executor(_with_lookup(charge, lookup))
    eid = start_execution(runtime_engine, _charge_flow())

    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    checkpoint = checkpoints(runtime_engine, eid)["charge"]
    assert (checkpoint.status, checkpoint.error_code) == ("FAILED", "UNCERTAIN")
    (line,) = attempt_history(runtime_engine, eid, "charge")
    assert line.message.startswith(NOT_FOUND_NOTE) and "no answer" in line.message

    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert [(c.external_key, c.attempt) for c in charge.calls] == [
        (f"{eid}:charge", 1),
        (f"{eid}:charge", 2),
    ]
    assert _history(runtime_engine, eid) == [(1, "FAILED", "UNCERTAIN"), (2, "SUCCEEDED", None)]
    assert not _lookups_audited(runtime_engine, eid)


def test_not_found_after_a_crash_runs_the_next_attempt_at_once(runtime_engine):
    charge = _charge({"chargeId": "ch-4"})
    lookup = answers(NotFound())
    eid = start_execution(runtime_engine, _charge_flow())
    # The process dies after RUNNING was committed, before the provider heard anything.
    crashing = _executor(charge.adapter(), hooks=WorkerHooks(before_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    expire_lease(runtime_engine, eid)
    lapse_earlier_calls(runtime_engine, eid)

    status = run_once(runtime_engine, _executor(_with_lookup(charge, lookup)), "recovering")

    assert status == "SUCCEEDED"
    assert [(c.external_key, c.attempt) for c in charge.calls] == [(f"{eid}:charge", 2)]
    assert _history(runtime_engine, eid) == [(1, "FAILED", "INTERRUPTED"), (2, "SUCCEEDED", None)]
    assert not _lookups_audited(runtime_engine, eid)


def test_not_found_for_a_holder_that_may_only_be_paused_waits_until_its_call_cannot_send(
    runtime_engine,
):
    # The holder lost its lease a moment after it started the call: it may be paused (a
    # GC, a frozen VM) with its request not yet sent, so NotFound proves nothing yet.
    charge = _charge({"chargeId": "ch-new"})
    eid = start_execution(runtime_engine, _charge_flow())
    crashing = _executor(charge.adapter(), hooks=WorkerHooks(before_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "paused")
    expire_lease(runtime_engine, eid)
    grace = 7.0
    recovering = _executor(
        _with_lookup(charge, answers(NotFound())), adapter_abandon_grace_seconds=grace
    )

    status = run_once(runtime_engine, recovering, "recovering")

    assert status == "RETRY_WAIT" and not charge.calls
    row = execution(runtime_engine, eid)
    # No attempt spent; due once the first holder's deadline and the grace have passed.
    assert (row.attempts, row.error_code) == (1, "EARLIER_CALL_PENDING")
    left = checkpoints(runtime_engine, eid)["charge"]
    assert left.status == "RUNNING", "the first holder's attempt was settled without proof"
    started = left.started_at
    timeout = charge.adapter().timeout_seconds
    assert row.next_attempt_at == started + timedelta(seconds=timeout + grace)
    (waited,) = audit(runtime_engine, eid, "EARLIER_CALL_PENDING")
    assert (waited.detail["actionId"], waited.detail["attempt"]) == ("charge", 1)

    # The paused holder woke before its deadline and sent: the next look-up finds it.
    make_due(runtime_engine, eid)
    found = _executor(
        _with_lookup(charge, answers(Found({"chargeId": "ch-1"}))),
        adapter_abandon_grace_seconds=grace,
    )
    assert run_once(runtime_engine, found, "recovering") == "SUCCEEDED"
    assert not charge.calls, "the write was made a second time"
    assert execution(runtime_engine, eid).attempts == 2


def test_not_found_with_no_attempts_left_fails_and_releases_the_request(runtime_engine):
    charge = _charge(scripted(UncertainError()), max_attempts=1)
    eid = start_execution(runtime_engine, _charge_flow())

    status = run_once(runtime_engine, _executor(_with_lookup(charge, answers(NotFound()))))

    # The write rule has nothing in doubt: a known failure, not a case for a person.
    assert status == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "RETRIES_EXHAUSTED"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None
    assert _history(runtime_engine, eid) == [(1, "FAILED", "UNCERTAIN")]
    assert audit(runtime_engine, eid, "EXECUTION_FAILED")


def test_not_found_after_a_crash_on_the_last_attempt_fails_and_releases_the_request(
    runtime_engine,
):
    charge = _charge({"chargeId": "ch-9"}, max_attempts=1)
    eid = start_execution(runtime_engine, _charge_flow())
    crashing = _executor(charge.adapter(), hooks=WorkerHooks(before_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    expire_lease(runtime_engine, eid)
    lapse_earlier_calls(runtime_engine, eid)

    status = run_once(
        runtime_engine, _executor(_with_lookup(charge, answers(NotFound()))), "recovering"
    )

    assert status == "FAILED" and not charge.calls
    row = execution(runtime_engine, eid)
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None
    assert _history(runtime_engine, eid) == [(1, "FAILED", "INTERRUPTED")]


# --- a safe write the write rule would park ----------------------------------------------


@pytest.mark.parametrize("answer", ["found", "not found"])
def test_an_idempotent_write_out_of_attempts_is_looked_up_before_the_write_rule_parks(
    runtime_engine, answer
):
    write = _charge(
        scripted(UncertainError(), UncertainError()),
        max_attempts=2,
        effect=Effect.IDEMPOTENT_WRITE,
    )
    lookup = answers(Found({"chargeId": "ch-5"}) if answer == "found" else NotFound())
    executor = _executor(_with_lookup(write, lookup))
    eid = start_execution(runtime_engine, _charge_flow())

    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    assert not lookup.calls, "a safe write with attempts left is retried, not looked up"
    make_due(runtime_engine, eid)
    status = run_once(runtime_engine, executor)

    assert [c.attempt for c in lookup.calls] == [2]
    row = execution(runtime_engine, eid)
    request = request_row(runtime_engine, row.request_id)
    if answer == "found":
        assert status == "SUCCEEDED"
        assert _history(runtime_engine, eid) == [
            (1, "UNKNOWN", "UNCERTAIN"),
            (2, "SUCCEEDED", None),
        ]
        assert _lookups_audited(runtime_engine, eid) == [
            {"actionId": "charge", "attempt": 2, "externalKey": f"{eid}:charge"}
        ]
    else:
        # Neither attempt wrote anything: attempt 1's UNKNOWN is settled, not in doubt.
        assert status == "FAILED"
        assert request.busy_execution_id is None
        checkpoint = checkpoints(runtime_engine, eid)["charge"]
        assert (checkpoint.status, checkpoint.attempt, checkpoint.attempt_base) == ("FAILED", 2, 2)
        assert _history(runtime_engine, eid) == [
            (1, "UNKNOWN", "UNCERTAIN"),
            (2, "FAILED", "UNCERTAIN"),
        ]


def test_an_idempotent_write_transiently_failing_after_an_uncertain_attempt_is_looked_up(
    runtime_engine,
):
    write = _charge(
        scripted(UncertainError(), TransientError("503")),
        max_attempts=2,
        effect=Effect.IDEMPOTENT_WRITE,
    )
    lookup = answers(NotFound())
    executor = _executor(_with_lookup(write, lookup))
    eid = start_execution(runtime_engine, _charge_flow())
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    make_due(runtime_engine, eid)

    assert run_once(runtime_engine, executor) == "FAILED"
    assert len(lookup.calls) == 1
    assert _history(runtime_engine, eid) == [
        (1, "UNKNOWN", "UNCERTAIN"),
        (2, "FAILED", "TRANSIENT"),
    ]


@pytest.mark.parametrize("answer", ["found", "not found"])
def test_an_idempotent_write_interrupted_on_its_last_attempt_is_looked_up(runtime_engine, answer):
    write = _charge({"chargeId": "ch-6"}, max_attempts=1, effect=Effect.IDEMPOTENT_WRITE)
    lookup = answers(Found({"chargeId": "ch-6"}) if answer == "found" else NotFound())
    eid = start_execution(runtime_engine, _charge_flow())
    crashing = _executor(write.adapter(), hooks=WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    expire_lease(runtime_engine, eid)

    status = run_once(runtime_engine, _executor(_with_lookup(write, lookup)), "recovering")

    assert len(write.calls) == 1
    if answer == "found":
        assert status == "SUCCEEDED"
        assert _history(runtime_engine, eid) == [(1, "SUCCEEDED", None)]
    else:
        # The write wrote no checkpoint before its call (SPEC 28): the holder that took
        # over recalled its attempt, dated when found, so the crashed call may still
        # send until that moment + its timeout + the grace: NotFound proves nothing yet.
        assert status == "RETRY_WAIT"
        assert audit(runtime_engine, eid, "EARLIER_CALL_PENDING")
        lapse_earlier_calls(runtime_engine, eid)
        make_due(runtime_engine, eid)
        status = run_once(runtime_engine, _executor(_with_lookup(write, lookup)), "later")
        assert status == "FAILED"
        assert _history(runtime_engine, eid) == [(1, "FAILED", "INTERRUPTED")]


# --- still in doubt: parked as before -----------------------------------------------------


def _blocks_past_its_timeout(release: threading.Event, returned: threading.Event) -> Lookup:
    def answer(ctx: ActionContext) -> Any:
        release.wait(30)
        returned.set()
        return Found({"chargeId": "late"})

    return Lookup(answer)


def _raises(ctx: ActionContext) -> Any:
    raise RuntimeError("provider search is down")


PARKED = {
    "unknown": (lambda ctx: Unknown(), "UNKNOWN"),
    "an error": (_raises, "ERROR"),
    "a found output breaking the schema": (lambda ctx: Found({"other": 1}), "OUTPUT_INVALID"),
    "something that is not an answer": (lambda ctx: {"chargeId": "ch"}, "ERROR"),
}


@pytest.mark.parametrize("case", list(PARKED))
def test_a_lookup_that_cannot_settle_it_parks_as_before(runtime_engine, case):
    answer, why = PARKED[case]
    charge = _charge(scripted(UncertainError()))
    eid = start_execution(runtime_engine, _charge_flow())

    status = run_once(runtime_engine, _executor(_with_lookup(charge, Lookup(answer))))

    assert status == "RECONCILIATION_REQUIRED"
    assert len(charge.calls) == 1
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail) == (
        "UNCERTAIN_OUTCOME",
        {"actionId": "charge", "lookup": why},
    )
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid
    assert checkpoints(runtime_engine, eid)["charge"].status == "UNKNOWN"
    assert _history(runtime_engine, eid) == [(1, "UNKNOWN", "UNCERTAIN")]
    assert not _lookups_audited(runtime_engine, eid)


def test_a_lookup_past_its_own_timeout_is_abandoned_and_its_late_answer_dropped(runtime_engine):
    release, returned = threading.Event(), threading.Event()
    lookup = _blocks_past_its_timeout(release, returned)
    charge = _charge(scripted(UncertainError()))
    eid = start_execution(runtime_engine, _charge_flow())

    status = run_once(
        runtime_engine, _executor(_with_lookup(charge, lookup, lookup_timeout_seconds=0.2))
    )

    assert not returned.is_set(), "the job waited for the lookup past its timeout"
    assert status == "RECONCILIATION_REQUIRED"
    assert execution(runtime_engine, eid).error_detail == {
        "actionId": "charge",
        "lookup": "TIMEOUT",
    }
    release.set()
    assert returned.wait(10)
    (asked,) = lookup.calls
    assert asked.should_stop(), "the abandoned lookup's stop signal was not set"
    assert checkpoints(runtime_engine, eid)["charge"].status == "UNKNOWN"
    assert not _lookups_audited(runtime_engine, eid)


def test_an_interrupted_write_whose_lookup_cannot_tell_is_parked_as_before(runtime_engine):
    charge = _charge({"chargeId": "ch-7"})
    eid = start_execution(runtime_engine, _charge_flow())
    crashing = _executor(charge.adapter(), hooks=WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    expire_lease(runtime_engine, eid)

    status = run_once(
        runtime_engine, _executor(_with_lookup(charge, answers(Unknown()))), "recovering"
    )

    assert status == "RECONCILIATION_REQUIRED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "INTERRUPTED_NON_IDEMPOTENT_WRITE"
    assert row.error_detail == {"actionId": "charge", "lookup": "UNKNOWN"}
    assert _history(runtime_engine, eid) == [(1, "UNKNOWN", "INTERRUPTED")]


# --- fenced -----------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["found", "not found"])
@pytest.mark.parametrize("path", ["uncertain call", "recovery"])
def test_a_stale_holders_lookup_answer_writes_nothing(runtime_engine, answer, path):
    charge = _charge(
        scripted(UncertainError()) if path == "uncertain call" else {"chargeId": "ch-8"}
    )
    eid = start_execution(runtime_engine, _charge_flow())
    if path == "recovery":
        crashing = _executor(charge.adapter(), hooks=WorkerHooks(after_adapter=crash_at_hook))
        with pytest.raises(SimulatedCrash):
            run_once(runtime_engine, crashing, "crashed")
        expire_lease(runtime_engine, eid)
    before = checkpoints(runtime_engine, eid).get("charge")

    def reclaimed_meanwhile(ctx: ActionContext) -> Any:
        # While the provider is being asked, the lease runs out and another worker claims.
        expire_lease(runtime_engine, eid)
        claim_one(runtime_engine, "newer")
        return Found({"chargeId": "ch-8"}) if answer == "found" else NotFound()

    status = run_once(runtime_engine, _executor(_with_lookup(charge, Lookup(reclaimed_meanwhile))))

    assert status == LEASE_LOST
    row = execution(runtime_engine, eid)
    assert (row.status, row.lease_owner) == ("RUNNING", "newer")
    checkpoint = checkpoints(runtime_engine, eid)["charge"]
    if before is not None:  # recovery: the crashed attempt's row, untouched
        assert (checkpoint.status, checkpoint.attempt) == (before.status, before.attempt)
    assert checkpoint.status == "RUNNING" and checkpoint.output is None
    assert _history(runtime_engine, eid) == []
    assert not _lookups_audited(runtime_engine, eid)
    assert not audit(runtime_engine, eid, "RETRY_SCHEDULED")
    assert not audit(runtime_engine, eid, "EXECUTION_FAILED")


# --- the contract -----------------------------------------------------------------------


def test_the_lookup_timeout_defaults_to_the_calls_and_must_be_positive():
    charge = _charge({"chargeId": "x"})
    assert _with_lookup(charge, answers(NotFound())).lookup_timeout_seconds == 5
    assert charge.adapter().lookup_timeout_seconds is None
    with pytest.raises(ValueError, match="lookup_timeout_seconds must be positive"):
        _with_lookup(charge, answers(NotFound()), lookup_timeout_seconds=0)
    with pytest.raises(ValueError, match="no lookup is"):
        dataclasses.replace(charge.adapter(), lookup_timeout_seconds=1)
    read = Double("test.read", Effect.READ_ONLY)
    with pytest.raises(ValueError, match="READ_ONLY"):
        dataclasses.replace(read.adapter(), lookup=answers(NotFound()))


def test_start_up_refuses_a_lookup_timeout_not_below_the_lease():
    registry = AdapterRegistry()
    charge = _charge({"chargeId": "x"})
    registry.add(_with_lookup(charge, answers(NotFound()), lookup_timeout_seconds=30))

    with pytest.raises(ConfigError) as refused:
        registry.check_timeouts_below(30)
    assert refused.value.problems == [
        "adapter test.charge@1 has lookup_timeout_seconds=30, which is not below "
        "WORKER_LEASE_SECONDS=30"
    ]
    registry.check_timeouts_below(31)


def test_a_lookup_timeout_not_below_the_lease_fails_before_any_call(runtime_engine):
    charge = _charge({"chargeId": "x"})
    adapter = _with_lookup(charge, answers(NotFound()), lookup_timeout_seconds=40)
    eid = start_execution(runtime_engine, _charge_flow())

    assert run_once(runtime_engine, _executor(adapter)) == "FAILED"
    assert not charge.calls
    assert execution(runtime_engine, eid).error_code == "INTEGRATION_UNAVAILABLE"
