"""An operator's decisions on a parked execution, and cancel, at the protocol level."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from orquestador.actions import Effect, NotReady, TransientError, UncertainError
from orquestador.errors import DecisionInvalid, NotCancellable, NotReconcilable
from orquestador.queue import Resolution, cancel, claim_round, resolve
from orquestador.queue.claims import _CLAIM
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import (
    ORG,
    SimulatedCrash,
    action,
    attempt_history,
    audit,
    checkpoints,
    claim_one,
    execution,
    expire_lease,
    flow_definition,
    make_due,
    registry_of,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double


def _no_problems(capability, version, output):
    return []


def _decide(engine, eid, decision, *, action_id="charge", problems=_no_problems, **extra):
    resolution = Resolution(
        execution_id=eid,
        org_id=ORG,
        actor="operator-1",
        decision=decision,
        reason="checked the provider's records",
        action_id=action_id,
        **extra,
    )
    with engine.connect() as conn:
        return resolve(conn, resolution, output_problems=problems, claims_budget=10)


def _parked_charge(engine, *outputs, max_attempts=3, on_error=None):
    charge = Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        max_attempts=max_attempts,
        output=scripted(UncertainError("read timed out"), *outputs),
    )
    extra = {"onError": on_error} if on_error else {}
    eid = start_execution(engine, flow_definition([action("charge", "test.charge", **extra)]))
    assert run_once(engine, Executor(registry_of(charge), settings())) == "RECONCILIATION_REQUIRED"
    return charge, eid


def test_confirm_records_the_output_and_the_execution_finishes_without_calling_again(
    runtime_engine,
):
    charge, eid = _parked_charge(runtime_engine)
    assert _decide(runtime_engine, eid, "confirm", output={"chargeId": "ch_1"}) == "PENDING"
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"

    assert len(charge.calls) == 1
    assert checkpoints(runtime_engine, eid)["charge"].output == {"chargeId": "ch_1"}
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id, request.revision) == ("done", None, 3)
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.actor == "operator-1"
    assert resolved.detail["decision"] == "confirm"
    assert resolved.detail["reason"] == "checked the provider's records"
    assert resolved.detail["output"] == {"chargeId": "ch_1"}
    assert resolved.detail["checkpoint"]["status"] == "UNKNOWN"
    assert resolved.detail["checkpoint"]["externalKey"] == f"{eid}:charge"


def test_a_confirmed_output_keeps_no_configured_secret_in_the_audit_trail(
    runtime_engine, monkeypatch
):
    monkeypatch.setenv("PROVIDER_API_KEY", "sk_live_4f9a2c")
    _charge, eid = _parked_charge(runtime_engine)
    output = {"chargeId": "ch_1", "receipt": "paid with key sk_live_4f9a2c"}

    assert _decide(runtime_engine, eid, "confirm", output=output) == "PENDING"

    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.detail["output"] == {"chargeId": "ch_1", "receipt": "paid with key [redacted]"}
    # The step's own output is what the flow goes on with: exactly as confirmed.
    assert checkpoints(runtime_engine, eid)["charge"].output == output


def test_confirm_refuses_an_output_the_adapter_schema_refuses(runtime_engine):
    _charge, eid = _parked_charge(runtime_engine)
    with pytest.raises(DecisionInvalid) as refused:
        _decide(
            runtime_engine,
            eid,
            "confirm",
            output={"chargeId": 5},
            problems=lambda capability, version, output: ["/chargeId"],
        )
    assert (refused.value.code, refused.value.paths) == ("OUTPUT_INVALID", ["/chargeId"])
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


def test_retry_runs_the_step_again_with_the_same_key_and_a_fresh_budget(runtime_engine):
    charge, eid = _parked_charge(runtime_engine, {"chargeId": "ch_2"}, max_attempts=1)
    assert _decide(runtime_engine, eid, "retry") == "PENDING"
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"

    assert [call.external_key for call in charge.calls] == [f"{eid}:charge"] * 2
    assert [(r.attempt, r.status) for r in attempt_history(runtime_engine, eid, "charge")] == [
        (1, "UNKNOWN"),
        (2, "SUCCEEDED"),
    ]


def test_a_failure_after_an_approved_retry_is_a_plain_failure(runtime_engine):
    # The operator settled the uncertain attempt: it no longer keeps the request busy.
    charge, eid = _parked_charge(runtime_engine, TransientError("declined"), max_attempts=1)
    _decide(runtime_engine, eid, "retry")
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "FAILED"
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("new", None)


@pytest.mark.parametrize(
    ("to_state", "on_error", "expected_state", "revision"),
    [
        (None, None, "new", 2),
        (None, "attention", "attention", 3),
        ("other", "attention", "other", 3),
    ],
)
def test_fail_moves_the_request_and_releases_it(
    runtime_engine, to_state, on_error, expected_state, revision
):
    _charge, eid = _parked_charge(runtime_engine, on_error=on_error)
    request_id = execution(runtime_engine, eid).request_id
    with runtime_engine.connect() as conn:
        data_before = conn.execute(
            text("SELECT data::text FROM request WHERE id = :id"), {"id": request_id}
        ).scalar_one()

    assert _decide(runtime_engine, eid, "fail", to_state=to_state) == "FAILED"

    request = request_row(runtime_engine, request_id)
    assert (request.state, request.revision, request.busy_execution_id) == (
        expected_state,
        revision,
        None,
    )
    with runtime_engine.connect() as conn:
        data_after = conn.execute(
            text("SELECT data::text FROM request WHERE id = :id"), {"id": request_id}
        ).scalar_one()
    assert data_after == data_before
    row = execution(runtime_engine, eid)
    assert (row.status, row.result["toState"]) == ("FAILED", expected_state)
    assert audit(runtime_engine, eid, "TRANSITION_FAILED")


def test_fail_to_a_state_the_flow_does_not_have_is_refused(runtime_engine):
    _charge, eid = _parked_charge(runtime_engine)
    with pytest.raises(DecisionInvalid) as refused:
        _decide(runtime_engine, eid, "fail", to_state="nowhere")
    assert refused.value.code == "STATE_UNKNOWN"
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


def test_a_decision_about_another_step_or_an_unparked_execution_is_refused(runtime_engine):
    _charge, eid = _parked_charge(runtime_engine)
    with pytest.raises(NotReconcilable):
        _decide(runtime_engine, eid, "retry", action_id="other")
    _decide(runtime_engine, eid, "retry")
    with pytest.raises(NotReconcilable):
        _decide(runtime_engine, eid, "fail")


def test_two_operators_at_once_exactly_one_wins(runtime_engine):
    _charge, eid = _parked_charge(runtime_engine)
    start = threading.Barrier(2)
    outcomes = []

    def operator(decision):
        start.wait(10)
        try:
            outcomes.append(_decide(runtime_engine, eid, decision))
        except NotReconcilable:
            outcomes.append("refused")

    threads = [threading.Thread(target=operator, args=(d,)) for d in ("retry", "fail")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(outcomes) in (["PENDING", "refused"], ["FAILED", "refused"])
    assert len(audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")) == 1


def test_a_contract_mismatch_accepts_retry_but_not_confirm(runtime_engine):
    first = Double("test.read", Effect.READ_ONLY, output={"value": 1})
    second = Double("test.write", Effect.IDEMPOTENT_WRITE)
    definition = flow_definition([action("first", "test.read"), action("second", "test.write")])
    eid = start_execution(runtime_engine, definition)

    def crash(claim, action_id):
        if action_id == "second":
            raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run_once(
            runtime_engine,
            Executor(registry_of(first, second), settings(), WorkerHooks(before_adapter=crash)),
        )
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE action_execution SET input_hash = 'changed' WHERE action_id = 'first'")
        )
    expire_lease(runtime_engine, eid)
    executor = Executor(registry_of(first, second), settings())
    assert run_once(runtime_engine, executor) == "RECONCILIATION_REQUIRED"
    assert execution(runtime_engine, eid).error_code == "CONTRACT_MISMATCH"

    with pytest.raises(NotReconcilable):
        _decide(runtime_engine, eid, "confirm", action_id="first", output={"value": 1})
    assert _decide(runtime_engine, eid, "retry", action_id="first") == "PENDING"
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert len(first.calls) == 2  # the discarded checkpoint's step ran again


def test_cancel_ends_a_pending_execution_and_releases_its_request(runtime_engine):
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="ordered by mistake").status
            == "CANCELLED"
        )
    row = execution(runtime_engine, eid)
    assert row.status == "CANCELLED" and row.finished_at is not None
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("new", 2, None)
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.detail == {
        "reason": "ordered by mistake",
        "fromStatus": "PENDING",
        "machineCommands": {"cancelled": [], "stopRequested": []},
    }
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []


def test_a_running_execution_records_the_cancel_for_its_holder_once(runtime_engine):
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    claim_one(runtime_engine)
    with runtime_engine.connect() as conn:
        first = cancel(conn, eid, org_id=ORG, actor="user-1", reason="too late")
    with runtime_engine.connect() as conn:
        again = cancel(conn, eid, org_id=ORG, actor="user-2", reason="still too late")

    assert (first.status, first.requested) == ("RUNNING", True)
    assert (again.status, again.requested) == ("RUNNING", True)
    row = execution(runtime_engine, eid)
    # Nothing is cut: the holder still holds it, and the first request is what is kept.
    assert row.status == "RUNNING" and row.lease_owner is not None
    assert row.cancel_requested_at is not None
    assert (row.cancel_requested_by, row.cancel_requested_reason) == ("user-1", "too late")
    (requested,) = audit(runtime_engine, eid, "CANCEL_REQUESTED")
    assert (requested.actor, requested.detail["reason"]) == ("user-1", "too late")
    assert requested.detail["fromStatus"] == "RUNNING"
    assert audit(runtime_engine, eid, "EXECUTION_CANCELLED") == []


def test_an_ended_execution_cannot_be_cancelled(runtime_engine):
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    with runtime_engine.connect() as conn:
        cancel(conn, eid, org_id=ORG, actor="user-1", reason="first")
    with runtime_engine.connect() as conn, pytest.raises(NotCancellable):
        cancel(conn, eid, org_id=ORG, actor="user-1", reason="twice")


def test_cancel_racing_a_claim_exactly_one_wins(runtime_engine, owner_engine):
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    # The claim statement holds its row lock until this transaction ends; the cancel
    # queues on it, then finds the execution RUNNING.
    claimer = runtime_engine.connect()
    claiming = claimer.begin()
    claimed = claimer.execute(_CLAIM, {"limit": 1, "owner": "w", "lease_seconds": 30.0}).all()
    assert [row.id for row in claimed] == [eid]
    result = {}

    def cancel_now():
        with runtime_engine.connect() as conn:
            try:
                cancelled = cancel(conn, eid, org_id=ORG, actor="user-1", reason="race")
                result["status"] = "requested" if cancelled.requested else cancelled.status
            except NotCancellable:
                result["status"] = "refused"

    thread = threading.Thread(target=cancel_now)
    thread.start()
    try:
        _wait_for_lock_wait(owner_engine)
    finally:
        claiming.commit()
        claimer.close()
    thread.join(20)
    # It found the claim's RUNNING: recorded for the holder, never applied under it.
    assert result == {"status": "requested"}
    assert execution(runtime_engine, eid).status == "RUNNING"

    # The other order: a cancel that holds the row keeps a claim out for good.
    other = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    with runtime_engine.connect() as conn:
        cancel(conn, other, org_id=ORG, actor="user-1", reason="first")
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []


# --- cancel after writes: the write rule decides, never the cancel -----------------------


def _charged_then_waiting(engine, second, *, second_effect=Effect.READ_ONLY, **run):
    """A charge that succeeded, then a second step that leaves the execution waiting."""
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output={"chargeId": "ch_1"})
    then = Double("test.then", second_effect, output=second)
    definition = flow_definition(
        [action("charge", "test.charge"), action("then", "test.then", onError="attention")]
    )
    eid = start_execution(engine, definition, {"plan": "pro"})
    status = run_once(engine, Executor(registry_of(charge, then), settings()))
    return charge, then, eid, status


def _parked_by_cancel(engine, eid, from_status, succeeded, in_doubt):
    """The cancel parked the execution: request busy as accepted, audited with who and why."""
    with engine.connect() as conn:
        assert cancel(
            conn, eid, org_id=ORG, actor="user-1", reason="customer changed plan"
        ).status == ("RECONCILIATION_REQUIRED")
    row = execution(engine, eid)
    assert (row.status, row.error_code, row.finished_at) == (
        "RECONCILIATION_REQUIRED",
        "CANCELLED_AFTER_WRITES",
        None,
    )
    writes = {"writesSucceeded": succeeded, "writesInDoubt": in_doubt}
    assert row.error_detail == {"fromStatus": from_status, **writes}
    request = request_row(engine, row.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("new", 2, eid)
    assert request.data == {"plan": "pro"}
    assert audit(engine, eid, "EXECUTION_CANCELLED") == []
    (parked,) = audit(engine, eid, "RECONCILIATION_REQUIRED")
    assert parked.actor == "user-1"
    assert {k: v for k, v in parked.detail.items() if k != "checkpoints"} == {
        "reason": "CANCELLED_AFTER_WRITES",
        "cancelReason": "customer changed plan",
        "fromStatus": from_status,
        **writes,
        "machineCommands": {"cancelled": [], "stopRequested": []},
    }
    assert {c["actionId"]: c["status"] for c in parked.detail["checkpoints"]}["charge"] == (
        "SUCCEEDED"
    )
    # Parked is not due: no worker takes it, whatever its due time was.
    make_due(engine, eid)
    with engine.connect() as conn:
        assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []
    return row


def test_cancel_in_retry_wait_after_a_charge_parks_and_an_operator_s_fail_releases(
    runtime_engine,
):
    charge, _then, eid, status = _charged_then_waiting(
        runtime_engine, scripted(TransientError("provider busy"))
    )
    assert status == "RETRY_WAIT"

    _parked_by_cancel(runtime_engine, eid, "RETRY_WAIT", ["charge"], [])

    # The operator decides about the step that was waiting; fail releases the request.
    assert _decide(runtime_engine, eid, "fail", action_id="then", to_state="other") == "FAILED"
    row = execution(runtime_engine, eid)
    assert (row.status, row.error_code, row.result["toState"]) == (
        "FAILED",
        "CANCELLED_AFTER_WRITES",
        "other",
    )
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("other", 3, None)
    assert request.data == {"plan": "pro"}
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert (resolved.actor, resolved.detail["parkedFor"]) == (
        "operator-1",
        "CANCELLED_AFTER_WRITES",
    )
    assert len(charge.calls) == 1


def test_cancel_in_retry_wait_with_a_write_in_doubt_parks_and_retry_continues(runtime_engine):
    # An idempotent write that may have happened is retried by the worker, not parked;
    # a cancel in that wait must not release the request either.
    charge, then, eid, status = _charged_then_waiting(
        runtime_engine,
        scripted(UncertainError("no answer"), {"synced": True}),
        second_effect=Effect.IDEMPOTENT_WRITE,
    )
    assert status == "RETRY_WAIT"

    _parked_by_cancel(runtime_engine, eid, "RETRY_WAIT", ["charge"], ["then"])

    assert _decide(runtime_engine, eid, "retry", action_id="then") == "PENDING"
    assert run_once(runtime_engine, Executor(registry_of(charge, then), settings())) == (
        "SUCCEEDED"
    )
    assert len(charge.calls) == 1
    assert [c.external_key for c in then.calls] == [f"{eid}:then"] * 2
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("done", 3, None)


def test_cancel_while_waiting_after_a_write_parks_and_confirm_finishes(runtime_engine):
    charge, then, eid, status = _charged_then_waiting(
        runtime_engine, lambda ctx: (_ for _ in ()).throw(NotReady(3600, wait_key="k-1"))
    )
    assert status == "WAITING"

    row = _parked_by_cancel(runtime_engine, eid, "WAITING", ["charge"], [])
    assert row.wait_key is None

    assert (
        _decide(runtime_engine, eid, "confirm", action_id="then", output={"seen": True})
        == "PENDING"
    )
    assert run_once(runtime_engine, Executor(registry_of(charge, then), settings())) == (
        "SUCCEEDED"
    )
    assert (len(charge.calls), len(then.calls)) == (1, 1)
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("done", None)


def test_cancel_of_a_confirmed_execution_not_yet_claimed_parks_with_nothing_in_doubt(
    runtime_engine,
):
    # PENDING after an operator confirmed the charge: every step succeeded, so the
    # operator decides without an action, as for any execution parked after its writes.
    _charge, eid = _parked_charge(runtime_engine)
    _decide(runtime_engine, eid, "confirm", output={"chargeId": "ch_1"})
    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="too late, sorry").status
            == "RECONCILIATION_REQUIRED"
        )
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail) == (
        "CANCELLED_AFTER_WRITES",
        {"fromStatus": "PENDING", "writesSucceeded": ["charge"], "writesInDoubt": []},
    )
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid

    assert _decide(runtime_engine, eid, "fail", action_id=None) == "FAILED"
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("new", 2, None)


def test_cancel_after_only_reads_still_cancels_and_releases(runtime_engine):
    lookup = Double("test.lookup", Effect.READ_ONLY, output={"found": True})
    then = Double("test.then", Effect.READ_ONLY, output=scripted(TransientError("busy")))
    definition = flow_definition([action("look", "test.lookup"), action("then", "test.then")])
    eid = start_execution(runtime_engine, definition, {"plan": "pro"})
    assert run_once(runtime_engine, Executor(registry_of(lookup, then), settings())) == (
        "RETRY_WAIT"
    )

    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="not needed").status == "CANCELLED"
        )
    row = execution(runtime_engine, eid)
    assert (row.status, row.error_code) == ("CANCELLED", "CANCELLED")
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == ("new", 2, None)
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.detail == {
        "reason": "not needed",
        "fromStatus": "RETRY_WAIT",
        "machineCommands": {"cancelled": [], "stopRequested": []},
    }
    assert audit(runtime_engine, eid, "RECONCILIATION_REQUIRED") == []


def _wait_for_lock_wait(owner_engine):
    def waiting():
        with owner_engine.connect() as conn:
            return conn.execute(
                text("""SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'""")
            ).scalar_one()

    wait_until(waiting, what="the cancel to wait on the claim's lock")
