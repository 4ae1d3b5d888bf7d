"""Cancel reaches running work (SPEC 25): recorded while a step's call runs, applied by its
holder when the call returns, by the write rule; never by a stale holder."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import Effect, NotReady, TransientError
from orquestador.errors import LeaseLost
from orquestador.queue.cancel_requests import honour_cancel
from orquestador.queue.reconciliation import cancel
from orquestador.worker.daemon import Worker
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, running_api
from tests.integration.execution_page_support import signed_in, text_of
from tests.integration.worker_support import (
    ORG,
    SimulatedCrash,
    action,
    audit,
    claim_one,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    registry_of,
    request_row,
    settings,
    start_execution,
    status_is,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double

CANCELLER: dict[str, Any] = {
    "org": ORG,
    "sub": "operator-1",
    "scopes": ["executions:cancel", "requests:read-all"],
}


class Gate:
    """An adapter body that signals it is in the call, then waits to be let go."""

    def __init__(self, output: dict[str, Any]) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.output = output

    def __call__(self, ctx: Any) -> dict[str, Any]:
        self.entered.set()
        assert self.release.wait(20), "the test never let the call return"
        return dict(self.output)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def run_worker(database, runtime_engine: Engine) -> Iterator[Any]:
    started: list[Worker] = []

    def start(*doubles: Double, **overrides: Any) -> Worker:
        worker = Worker(
            settings(database_url=database.runtime_dsn, **overrides),
            runtime_engine,
            registry_of(*doubles),
        )
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(timeout=30)


def _cancel(api: Api, eid: uuid.UUID, reason: str = "the customer called it off") -> Any:
    response = api.post(f"/executions/{eid}/cancel", {"reason": reason}, **CANCELLER)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def _requested_while_in_the_call(api: Api, eid: uuid.UUID, gate: Gate) -> None:
    assert gate.entered.wait(20), "the worker never called the step"
    view = _cancel(api, eid)
    assert (view["status"], view["cancelRequested"]) == ("RUNNING", True)
    assert view["cancelRequestedBy"] == "operator-1"
    # A second cancel while the call runs answers the same and records nothing new.
    again = _cancel(api, eid, "twice")
    assert (again["status"], again["cancelRequested"]) == ("RUNNING", True)
    assert again["cancelRequestedAt"] == view["cancelRequestedAt"]
    # The page says who asked, and offers no second cancel.
    page = text_of(signed_in(api, **CANCELLER).get(f"/ui/executions/{eid}").get_data(as_text=True))
    assert "Cancel requested by operator-1 at " in page
    assert "Cancel this execution" not in page


def test_a_read_in_flight_ends_cancelled_when_its_call_returns_and_nothing_after_runs(
    api: Api, runtime_engine: Engine, run_worker: Any
) -> None:
    gate = Gate({"seen": 1})
    slow = Double("test.slow", Effect.READ_ONLY, output=gate)
    after = Double("test.after", Effect.NON_IDEMPOTENT_WRITE)
    eid = start_execution(
        runtime_engine,
        flow_definition([action("look", "test.slow"), action("charge", "test.after")]),
    )
    run_worker(slow, after)

    _requested_while_in_the_call(api, eid, gate)
    gate.release.set()
    wait_until(status_is(runtime_engine, eid, "CANCELLED"), what="the cancel to be applied")

    assert after.calls == []  # the next step never started
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.lease_owner) == ("CANCELLED", None)
    request = request_row(runtime_engine, row.request_id)
    assert request.busy_execution_id is None and request.state == "new"
    (requested,) = audit(runtime_engine, eid, "CANCEL_REQUESTED")
    assert (requested.actor, requested.detail["reason"]) == (
        "operator-1",
        "the customer called it off",
    )
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.actor == "operator-1"
    assert cancelled.detail["fromStatus"] == "RUNNING"
    assert cancelled.detail["appliedBy"] == "system:worker"
    # The call's outcome was recorded before the cancel: the read's success is kept.
    shown = api.get(f"/executions/{eid}", **CANCELLER).get_json()
    assert [s["status"] for s in shown["steps"]] == ["SUCCEEDED"]
    assert "cancelRequested" not in shown


@pytest.mark.parametrize("next_effect", [Effect.IDEMPOTENT_WRITE, Effect.READ_ONLY])
def test_a_write_done_in_flight_parks_cancelled_after_writes_with_the_write_listed(
    api: Api, runtime_engine: Engine, run_worker: Any, next_effect: Effect
) -> None:
    gate = Gate({"chargeId": "ch_1"})
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output=gate)
    after = Double("test.after", next_effect)
    eid = start_execution(
        runtime_engine,
        flow_definition([action("charge", "test.charge"), action("then", "test.after")]),
    )
    run_worker(charge, after)

    _requested_while_in_the_call(api, eid, gate)
    gate.release.set()
    wait_until(
        status_is(runtime_engine, eid, "RECONCILIATION_REQUIRED"), what="the cancel to park it"
    )

    assert len(charge.calls) == 1  # the write was never cut
    # No step starts after the request: the charge's own success, written alone, learns
    # of it, so the next step is not called, whether or not it would have written a
    # RUNNING checkpoint before its call (SPEC 28).
    assert after.calls == []
    assert execution(runtime_engine, eid).result is None
    row = execution(runtime_engine, eid)
    assert row.error_code == "CANCELLED_AFTER_WRITES"
    assert row.error_detail == {
        "fromStatus": "RUNNING",
        "writesSucceeded": ["charge"],
        "writesInDoubt": [],
    }
    # Never released while a write is done: the request stays busy for a person.
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid
    (parked,) = audit(runtime_engine, eid, "RECONCILIATION_REQUIRED")
    assert (parked.actor, parked.detail["cancelReason"]) == (
        "operator-1",
        "the customer called it off",
    )
    assert audit(runtime_engine, eid, "EXECUTION_CANCELLED") == []


def test_a_wait_being_checked_again_honours_a_cancel_asked_during_the_check(
    api: Api, runtime_engine: Engine, run_worker: Any
) -> None:
    entered, release = threading.Event(), threading.Event()
    rounds: list[int] = []

    def check(ctx: Any) -> dict[str, Any]:
        rounds.append(ctx.attempt)
        if len(rounds) == 2:  # the re-check: held in the call while the cancel lands
            entered.set()
            assert release.wait(20)
        raise NotReady(check_again_in=60)

    waits = Double("test.wait", Effect.READ_ONLY, output=check)
    eid = start_execution(runtime_engine, flow_definition([action("wait", "test.wait")]))
    run_worker(waits)
    wait_until(status_is(runtime_engine, eid, "WAITING"), what="the first round to wait")
    with runtime_engine.begin() as conn:  # what a wake on its key does: due now
        conn.execute(
            text("UPDATE execution SET next_attempt_at = now() WHERE id = :id"), {"id": eid}
        )

    assert entered.wait(20), "the wait was never checked again"
    view = _cancel(api, eid)
    assert (view["status"], view["cancelRequested"]) == ("RUNNING", True)
    release.set()
    wait_until(status_is(runtime_engine, eid, "CANCELLED"), what="the cancel to be applied")

    assert len(rounds) == 2  # not checked again after the cancel
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.actor == "operator-1"
    assert (
        request_row(runtime_engine, execution(runtime_engine, eid).request_id).busy_execution_id
        is None
    )


def test_a_stale_holder_cannot_apply_a_requested_cancel_and_the_next_holder_does(
    api: Api, runtime_engine: Engine
) -> None:
    read = Double("test.read", Effect.READ_ONLY)
    eid = start_execution(runtime_engine, flow_definition([action("look", "test.read")]))
    stale = claim_one(runtime_engine, "w1")
    _cancel(api, eid)
    expire_lease(runtime_engine, eid)

    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        honour_cancel(conn, stale)
    row = execution(runtime_engine, eid)
    assert row.status == "RUNNING" and row.cancel_requested_at is not None
    assert audit(runtime_engine, eid, "EXECUTION_CANCELLED") == []

    # The next holder applies it before calling anything.
    current = claim_one(runtime_engine, "w2")
    assert current.token == stale.token + 1
    with runtime_engine.connect() as conn:
        assert Executor(registry_of(read), settings()).run(conn, current) == "CANCELLED"
    assert read.calls == []
    row = execution(runtime_engine, eid)
    assert row.status == "CANCELLED"
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.busy_execution_id) == ("new", None)


def test_an_operator_retry_of_a_cancel_park_clears_the_request(
    api: Api, runtime_engine: Engine
) -> None:
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output={"chargeId": "ch_1"})
    # A write: its RUNNING is where the run learns of the cancel, before calling it.
    then = Double("test.then", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(
        runtime_engine,
        flow_definition([action("charge", "test.charge"), action("then", "test.then")]),
    )
    holder = claim_one(runtime_engine, "w1")
    hooks_seen: list[str] = []

    def cancel_after_the_charge(claim: Any, action_id: str) -> None:
        hooks_seen.append(action_id)
        if action_id == "charge":
            _cancel(api, eid)

    executor = Executor(
        registry_of(charge, then), settings(), WorkerHooks(after_adapter=cancel_after_the_charge)
    )
    with runtime_engine.connect() as conn:
        assert executor.run(conn, holder) == "RECONCILIATION_REQUIRED"
    assert hooks_seen == ["charge"] and then.calls == []

    decided = api.post(
        f"/executions/{eid}/reconciliation",
        {"actionId": None, "decision": "retry", "reason": "the customer wants it after all"},
        org=ORG,
        sub="operator-2",
        scopes=["executions:reconcile", "requests:read-all"],
    )
    assert decided.status_code == 200, decided.get_data(as_text=True)
    row = execution(runtime_engine, eid)
    assert row.status == "PENDING" and row.cancel_requested_at is None
    with runtime_engine.connect() as conn:
        assert (
            Executor(registry_of(charge, then), settings()).run(
                conn, claim_one(runtime_engine, "w1")
            )
            == "SUCCEEDED"
        )
    assert len(charge.calls) == 1 and len(then.calls) == 1


def test_a_cancel_found_by_the_next_holder_parks_when_the_dead_holders_write_is_in_doubt(
    api: Api, runtime_engine: Engine
) -> None:
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output={"chargeId": "ch_1"})
    eid = start_execution(runtime_engine, flow_definition([action("charge", "test.charge")]))
    dying = Executor(registry_of(charge), settings(), WorkerHooks(before_adapter=crash_at_hook))
    with runtime_engine.connect() as conn, pytest.raises(SimulatedCrash):
        dying.run(conn, claim_one(runtime_engine, "w1"))  # RUNNING written, then it died
    _cancel(api, eid)
    expire_lease(runtime_engine, eid)

    with runtime_engine.connect() as conn:
        status = Executor(registry_of(charge), settings()).run(
            conn, claim_one(runtime_engine, "w2")
        )

    # The write may have left before the holder died: never released, nothing called.
    assert status == "RECONCILIATION_REQUIRED" and charge.calls == []
    row = execution(runtime_engine, eid)
    assert row.error_code == "CANCELLED_AFTER_WRITES"
    assert row.error_detail["writesInDoubt"] == ["charge"]
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid


def test_a_call_that_ends_in_a_retry_is_due_at_once_and_the_next_claim_cancels_it(
    api: Api, runtime_engine: Engine, run_worker: Any
) -> None:
    gate = Gate({})
    calls: list[int] = []

    def flaky(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        gate(ctx)
        raise TransientError("the provider is busy")

    step = Double("test.flaky", Effect.IDEMPOTENT_WRITE, output=flaky)
    eid = start_execution(runtime_engine, flow_definition([action("send", "test.flaky")]))
    # A backoff far past the test's patience: only "due at once" can end it in time.
    run_worker(step, retry_base_seconds=120.0, retry_cap_seconds=240.0)

    assert gate.entered.wait(20), "the worker never called the step"
    _cancel(api, eid)
    gate.release.set()
    wait_until(status_is(runtime_engine, eid, "CANCELLED"), what="the cancel to be applied")

    assert calls == [1]  # never tried again
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert (cancelled.actor, cancelled.detail["fromStatus"]) == ("operator-1", "RUNNING")


def _check_then_continue() -> dict[str, Any]:
    """new --go--> ready (one read), and ready continues with reboot (one write)."""
    definition = flow_definition(
        [action("check", "test.check")],
        to="ready",
        states=("new", "ready", "done"),
        transition_id="go",
    )
    definition["transitions"].append(
        {"id": "reboot", "from": ["ready"], "actions": [action("send", "test.send")], "to": "done"}
    )
    definition["continue"] = {"ready": "reboot"}
    return definition


def test_a_cancel_asked_before_a_finish_that_continues_ends_it_and_continues_nothing(
    runtime_engine: Engine,
) -> None:
    check = Double("test.check", Effect.READ_ONLY)
    send = Double("test.send", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(runtime_engine, _check_then_continue(), {"machineId": "m-1"})

    def cancel_in_the_call(claim: Any, action_id: str) -> None:
        with runtime_engine.connect() as conn:
            assert cancel(conn, eid, org_id=ORG, actor="operator-1", reason="not today").requested

    executor = Executor(
        registry_of(check, send), settings(), WorkerHooks(after_adapter=cancel_in_the_call)
    )
    with runtime_engine.connect() as conn:
        assert executor.run(conn, claim_one(runtime_engine, "w1")) == "CANCELLED"

    assert send.calls == []
    with runtime_engine.connect() as conn:
        continued = conn.execute(
            text("SELECT count(*) FROM execution WHERE continued_from = :id"), {"id": eid}
        ).scalar()
    assert continued == 0
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("new", None)
