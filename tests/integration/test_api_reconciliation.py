"""Evidence, decisions and cancel over HTTP, on executions a real worker run parked."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from sqlalchemy import Engine, event, text

from orquestador.actions import Effect, TransientError, UncertainError
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.queue import claim_round
from orquestador.queue.claims import _CLAIM
from orquestador.worker.executor import Executor
from tests.integration.worker_support import (
    ORG,
    OWNER,
    action,
    audit,
    claim_one,
    execution,
    flow_definition,
    registry_of,
    run_once,
    scripted,
    settings,
    start_execution,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double

CHARGE_OUTPUT = {
    "type": "object",
    "required": ["chargeId"],
    "properties": {"chargeId": {"type": "string"}, "amount": {"type": "integer"}},
}
CARD = "4111-1111-secret"
REASON = "the provider's dashboard shows charge ch_1 for this key"

OPERATOR: dict[str, Any] = {
    "org": ORG,
    "sub": "operator-1",
    "scopes": ["executions:reconcile", "requests:read-all"],
}
REQUEST_OWNER: dict[str, Any] = {
    "org": ORG,
    "sub": OWNER,
    "scopes": ["requests:read", "requests:write"],
}


def _charge(*script: Any, max_attempts: int = 3) -> Double:
    remaining = list(script)

    def play(ctx: Any) -> dict[str, Any]:
        step = remaining.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    return Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        max_attempts=max_attempts,
        output=play,
        output_schema=CHARGE_OUTPUT,
    )


@pytest.fixture
def api(database) -> Iterator[Api]:
    # The API checks confirmed outputs against the same adapter contract the worker runs.
    registry = registry_of(_charge())
    with running_api(database.runtime_dsn, registry=registry) as api:
        api.app.extensions[ADAPTERS_EXTENSION] = registry
        yield api


def _park(engine: Engine, charge: Double, *, on_error: str | None = None) -> uuid.UUID:
    extra = {"onError": on_error} if on_error else {}
    definition = flow_definition(
        [action("charge", "test.charge", input={"card": {"from": "/data/card"}}, **extra)]
    )
    eid = start_execution(engine, definition, {"card": CARD, "plan": "pro"})
    assert run_once(engine, Executor(registry_of(charge), settings())) == "RECONCILIATION_REQUIRED"
    return eid


def _decide(api: Api, eid: Any, decision: str, **fields: Any) -> Any:
    body = {"actionId": "charge", "decision": decision, "reason": REASON, **fields}
    return api.post(f"/executions/{eid}/reconciliation", body, **OPERATOR)


def _request_of(api: Api, engine: Engine, eid: Any) -> dict[str, Any]:
    request_id = execution(engine, eid).request_id
    response = api.get(f"/requests/{request_id}", **REQUEST_OWNER)
    assert response.status_code == 200
    return response.get_json()


# --- evidence ------------------------------------------------------------------------


def test_evidence_says_why_it_parked_which_step_is_in_doubt_and_what_the_provider_saw(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("read timed out after 10 s")))

    response = api.get(f"/executions/{eid}/evidence", **OPERATOR)

    assert response.status_code == 200
    body = response.get_json()
    assert (body["reason"], body["inDoubt"]) == ("UNCERTAIN_OUTCOME", "charge")
    assert body["execution"]["status"] == "RECONCILIATION_REQUIRED"
    (step,) = body["steps"]
    assert step["actionId"] == "charge"
    assert (step["capability"], step["version"], step["effect"]) == (
        "test.charge",
        1,
        "NON_IDEMPOTENT_WRITE",
    )
    assert (step["status"], step["attempt"], step["errorCode"]) == ("UNKNOWN", 1, "UNCERTAIN")
    assert step["externalKey"] == f"{eid}:charge"
    assert len(step["inputHash"]) >= 32
    assert step["message"] == "read timed out after 10 s"
    assert step["startedAt"] and step["finishedAt"]
    assert "output" not in step
    assert [(a["attempt"], a["status"]) for a in step["attempts"]] == [(1, "UNKNOWN")]
    kinds = [event["kind"] for event in body["audit"]]
    assert kinds == ["TRANSITION_ACCEPTED", "RECONCILIATION_REQUIRED"]
    assert body["audit"][0]["actor"] == OWNER
    assert body["audit"][1]["detail"]["reason"] == "UNCERTAIN_OUTCOME"
    text = response.get_data(as_text=True)
    for hidden in (CARD, "actor_snapshot", "actorSnapshot", "lease", "fencing", "scopes"):
        assert hidden not in text


def test_evidence_shows_the_outputs_of_succeeded_steps_and_nothing_to_decide_when_ended(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    assert _decide(api, eid, "confirm", output={"chargeId": "ch_1"}).status_code == 200

    body = api.get(f"/executions/{eid}/evidence", **OPERATOR).get_json()

    assert (body["reason"], body["inDoubt"]) == (None, None)
    (step,) = body["steps"]
    assert (step["status"], step["output"]) == ("SUCCEEDED", {"chargeId": "ch_1"})
    resolved = body["audit"][-1]
    assert (resolved["kind"], resolved["actor"]) == ("RECONCILIATION_RESOLVED", "operator-1")
    assert resolved["detail"]["decision"] == "confirm"


# --- the three decisions ---------------------------------------------------------------


def test_confirm_continues_from_the_checkpoint_without_calling_the_provider_again(
    api: Api, runtime_engine: Engine
) -> None:
    charge = _charge(UncertainError("read timed out"))
    eid = _park(runtime_engine, charge)
    before = _request_of(api, runtime_engine, eid)
    assert (before["state"], before["revision"], before["busy"]) == ("new", 2, True)
    assert before["busyExecutionId"] == str(eid)

    response = _decide(api, eid, "confirm", output={"chargeId": "ch_1", "amount": 1200})

    assert response.status_code == 200
    view = response.get_json()
    assert (view["id"], view["status"]) == (str(eid), "PENDING")
    assert [(s["actionId"], s["status"]) for s in view["steps"]] == [("charge", "SUCCEEDED")]
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    assert len(charge.calls) == 1
    after = _request_of(api, runtime_engine, eid)
    assert (after["state"], after["revision"], after["busy"]) == ("done", 3, False)
    assert "busyExecutionId" not in after
    assert after["data"] == {"card": CARD, "plan": "pro"}
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.actor == "operator-1"
    assert resolved.detail["decision"] == "confirm"
    assert resolved.detail["reason"] == REASON
    assert resolved.detail["actionId"] == "charge"
    assert resolved.detail["checkpoint"]["status"] == "UNKNOWN"
    assert resolved.detail["checkpoint"]["externalKey"] == f"{eid}:charge"


def test_retry_calls_the_provider_again_with_the_same_external_key(
    api: Api, runtime_engine: Engine
) -> None:
    charge = _charge(UncertainError("connection reset"), {"chargeId": "ch_2"}, max_attempts=1)
    eid = _park(runtime_engine, charge)

    response = _decide(api, eid, "retry")

    assert response.status_code == 200
    assert response.get_json()["status"] == "PENDING"
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    assert [ctx.external_key for ctx in charge.calls] == [f"{eid}:charge", f"{eid}:charge"]
    after = _request_of(api, runtime_engine, eid)
    assert (after["state"], after["revision"], after["busy"]) == ("done", 3, False)
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert (resolved.actor, resolved.detail["decision"]) == ("operator-1", "retry")
    assert resolved.detail["reason"] == REASON
    assert resolved.detail["checkpoint"]["attempt"] == 1


@pytest.mark.parametrize(
    ("to_state", "on_error", "expected_state", "revision"),
    [
        ("other", None, "other", 3),
        (None, "attention", "attention", 3),
        (None, None, "new", 2),
    ],
    ids=["to-state", "on-error-state", "stays"],
)
def test_fail_ends_the_execution_and_moves_and_releases_the_request(
    api: Api,
    runtime_engine: Engine,
    to_state: str | None,
    on_error: str | None,
    expected_state: str,
    revision: int,
) -> None:
    charge = _charge(UncertainError("read timed out"))
    eid = _park(runtime_engine, charge, on_error=on_error)

    fields = {"toState": to_state} if to_state else {}
    response = _decide(api, eid, "fail", **fields)

    assert response.status_code == 200
    view = response.get_json()
    assert (view["status"], view["toState"], view["errorCode"]) == (
        "FAILED",
        expected_state,
        "UNCERTAIN_OUTCOME",
    )
    after = _request_of(api, runtime_engine, eid)
    assert (after["state"], after["revision"], after["busy"]) == (expected_state, revision, False)
    assert after["data"] == {"card": CARD, "plan": "pro"}
    assert len(charge.calls) == 1
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert (resolved.actor, resolved.detail["decision"]) == ("operator-1", "fail")
    assert resolved.detail["checkpoint"]["actionId"] == "charge"
    (failed,) = audit(runtime_engine, eid, "TRANSITION_FAILED")
    assert failed.detail["toState"] == expected_state


# --- refusals --------------------------------------------------------------------------


def test_an_output_that_breaks_the_adapter_schema_is_422_with_its_paths(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))

    wrong = _decide(api, eid, "confirm", output={"chargeId": 5, "amount": "12"})
    missing = _decide(api, eid, "confirm")

    assert wrong.status_code == 422
    body = problem(wrong)
    assert body["code"] == "OUTPUT_INVALID"
    assert sorted(p["path"] for p in body["problems"]) == ["/output/amount", "/output/chargeId"]
    assert missing.status_code == 422
    assert [p["path"] for p in problem(missing)["problems"]] == ["/output"]
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"
    assert audit(runtime_engine, eid, "RECONCILIATION_RESOLVED") == []


def test_a_confirm_nobody_can_check_is_refused_as_integration_unavailable(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    api.app.extensions[ADAPTERS_EXTENSION] = registry_of()

    response = _decide(api, eid, "confirm", output={"chargeId": "ch_1"})

    assert response.status_code == 422
    assert problem(response)["code"] == "INTEGRATION_UNAVAILABLE"
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


@pytest.mark.parametrize(
    ("body", "paths"),
    [
        ({"actionId": "charge", "decision": "retry", "reason": ""}, ["/reason"]),
        ({"actionId": "charge", "decision": "retry", "reason": "   "}, ["/reason"]),
        ({"actionId": "charge", "decision": "retry"}, [""]),
        ({"actionId": "charge", "decision": "maybe", "reason": "x"}, ["/decision"]),
        ({"decision": "retry", "reason": "x"}, [""]),
        ({"actionId": "charge", "decision": "retry", "reason": "x", "colour": 1}, ["/colour"]),
        (
            {"actionId": "charge", "decision": "retry", "reason": "x", "output": {}},
            ["/output"],
        ),
        (
            {"actionId": "charge", "decision": "confirm", "reason": "x", "toState": "new"},
            ["/toState"],
        ),
    ],
    ids=[
        "empty-reason",
        "blank-reason",
        "no-reason",
        "unknown-decision",
        "no-action-id",
        "unknown-field",
        "output-on-retry",
        "to-state-on-confirm",
    ],
)
def test_a_malformed_decision_is_422_and_changes_nothing(
    api: Api, runtime_engine: Engine, body: dict[str, Any], paths: list[str]
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))

    response = api.post(f"/executions/{eid}/reconciliation", body, **OPERATOR)

    assert response.status_code == 422
    found = problem(response)
    assert found["code"] == "BODY_INVALID"
    assert sorted({p["path"] for p in found["problems"]}) == paths
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


def test_a_decision_on_another_step_or_on_an_unparked_execution_is_409(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    pending = start_execution(runtime_engine, flow_definition([action("x", "test.charge")]))

    other_step = api.post(
        f"/executions/{eid}/reconciliation",
        {"actionId": "refund", "decision": "retry", "reason": REASON},
        **OPERATOR,
    )
    no_step = api.post(
        f"/executions/{eid}/reconciliation",
        {"actionId": None, "decision": "retry", "reason": REASON},
        **OPERATOR,
    )
    not_parked = _decide(api, pending, "retry")

    for response in (other_step, no_step, not_parked):
        assert response.status_code == 409
        assert problem(response)["code"] == "NOT_RECONCILABLE"
    assert "charge" in problem(other_step)["detail"]
    assert "PENDING" in problem(not_parked)["detail"]


def test_two_operators_at_once_exactly_one_wins_and_the_other_gets_409(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    start = threading.Barrier(2)
    answers: dict[str, int] = {}

    def decide(decision: str, operator: str) -> None:
        client = api.client()
        headers = api.headers(**{**OPERATOR, "sub": operator})
        body = {"actionId": "charge", "decision": decision, "reason": f"{operator} checked"}
        start.wait(10)
        response = client.post(
            f"/api/v1/executions/{eid}/reconciliation", json=body, headers=headers
        )
        answers[decision] = response.status_code

    threads = [
        threading.Thread(target=decide, args=("retry", "operator-1")),
        threading.Thread(target=decide, args=("fail", "operator-2")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(answers.values()) == [200, 409]
    winner = next(decision for decision, status in answers.items() if status == 200)
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.detail["decision"] == winner
    assert execution(runtime_engine, eid).status == ("PENDING" if winner == "retry" else "FAILED")


# --- cancel ----------------------------------------------------------------------------


def _pending(engine: Engine) -> uuid.UUID:
    return start_execution(engine, flow_definition([action("charge", "test.charge")]))


def test_the_owner_cancels_a_pending_execution_and_the_request_is_released(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _pending(runtime_engine)

    response = api.post(
        f"/executions/{eid}/cancel", {"reason": "ordered by mistake"}, **REQUEST_OWNER
    )

    assert response.status_code == 200
    view = response.get_json()
    assert (view["status"], view["errorCode"]) == ("CANCELLED", "CANCELLED")
    after = _request_of(api, runtime_engine, eid)
    assert (after["state"], after["revision"], after["busy"]) == ("new", 2, False)
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert (cancelled.actor, cancelled.detail["reason"]) == (OWNER, "ordered by mistake")
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []

    again = api.post(f"/executions/{eid}/cancel", {"reason": "twice"}, **REQUEST_OWNER)
    assert again.status_code == 409
    assert problem(again)["code"] == "NOT_CANCELLABLE"


def test_cancel_after_a_charge_parks_for_an_operator_instead_of_releasing_the_request(
    api: Api, runtime_engine: Engine
) -> None:
    # The charge went through; the receipt waits for its retry when the owner cancels.
    # Releasing the request here would let a resubmission charge the customer again.
    charge = _charge({"chargeId": "ch_1"})
    receipt = Double("test.receipt", Effect.READ_ONLY, output=scripted(TransientError("busy")))
    definition = flow_definition(
        [action("charge", "test.charge"), action("receipt", "test.receipt")]
    )
    eid = start_execution(runtime_engine, definition, {"card": CARD, "plan": "pro"})
    executor = Executor(registry_of(charge, receipt), settings())
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"

    response = api.post(
        f"/executions/{eid}/cancel", {"reason": "customer changed plan"}, **REQUEST_OWNER
    )

    assert response.status_code == 200
    view = response.get_json()
    assert (view["status"], view["errorCode"]) == (
        "RECONCILIATION_REQUIRED",
        "CANCELLED_AFTER_WRITES",
    )
    assert view["errorDetail"] == {
        "fromStatus": "RETRY_WAIT",
        "writesSucceeded": ["charge"],
        "writesInDoubt": [],
    }
    before = _request_of(api, runtime_engine, eid)
    assert (before["state"], before["revision"], before["busy"]) == ("new", 2, True)
    assert before["busyExecutionId"] == str(eid)
    assert before["data"] == {"card": CARD, "plan": "pro"}
    resubmitted = api.post(
        f"/requests/{before['id']}/transitions",
        {"transition": "go", "expectedRevision": 2},
        **REQUEST_OWNER,
    )
    assert (resubmitted.status_code, problem(resubmitted)["code"]) == (409, "REQUEST_BUSY")

    evidence = api.get(f"/executions/{eid}/evidence", **OPERATOR).get_json()
    assert (evidence["reason"], evidence["inDoubt"]) == ("CANCELLED_AFTER_WRITES", "receipt")
    parked = evidence["audit"][-1]
    assert (parked["kind"], parked["actor"]) == ("RECONCILIATION_REQUIRED", OWNER)
    assert parked["detail"]["cancelReason"] == "customer changed plan"
    assert parked["detail"]["writesSucceeded"] == ["charge"]
    assert audit(runtime_engine, eid, "EXECUTION_CANCELLED") == []

    failed = _decide(api, eid, "fail", actionId="receipt", toState="other")
    assert failed.status_code == 200
    assert failed.get_json()["status"] == "FAILED"
    after = _request_of(api, runtime_engine, eid)
    assert (after["state"], after["revision"], after["busy"]) == ("other", 3, False)
    assert after["data"] == {"card": CARD, "plan": "pro"}
    assert len(charge.calls) == 1


def test_executions_cancel_reaches_every_request_of_the_organization(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _pending(runtime_engine)
    support = {"org": ORG, "sub": "support-1", "scopes": ["executions:cancel"]}

    response = api.post(f"/executions/{eid}/cancel", {"reason": "customer asked"}, **support)

    assert response.status_code == 200
    assert response.get_json()["status"] == "CANCELLED"
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.actor == "support-1"


def test_requests_write_cancels_only_the_callers_own_requests(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _pending(runtime_engine)
    path = f"/executions/{eid}/cancel"
    body = {"reason": "not mine"}

    stranger = api.post(path, body, org=ORG, sub="bob", scopes=["requests:write"])
    reader = api.post(
        path, body, org=ORG, sub="bob", scopes=["requests:write", "requests:read-all"]
    )
    missing = api.post(f"/executions/{uuid.uuid4()}/cancel", body, org=ORG, sub="bob")

    assert stranger.status_code == 404
    assert stranger.get_data() == missing.get_data()
    # Someone who may read it is told why, not that it does not exist.
    assert reader.status_code == 403
    assert problem(reader)["code"] == "INSUFFICIENT_SCOPE"
    assert execution(runtime_engine, eid).status == "PENDING"


def test_a_running_execution_answers_cancel_requested_and_again_the_same(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _pending(runtime_engine)
    claim_one(runtime_engine)

    response = api.post(f"/executions/{eid}/cancel", {"reason": "too late"}, **REQUEST_OWNER)
    again = api.post(f"/executions/{eid}/cancel", {"reason": "really"}, **REQUEST_OWNER)

    assert (response.status_code, again.status_code) == (200, 200)
    view = response.get_json()
    assert (view["status"], view["cancelRequested"]) == ("RUNNING", True)
    assert view["cancelRequestedBy"] == OWNER and view["cancelRequestedAt"]
    assert {k: again.get_json()[k] for k in ("status", "cancelRequested", "cancelRequestedAt")} == {
        k: view[k] for k in ("status", "cancelRequested", "cancelRequestedAt")
    }
    shown = api.get(f"/executions/{eid}", **REQUEST_OWNER).get_json()
    assert shown["cancelRequested"] is True
    assert execution(runtime_engine, eid).status == "RUNNING"
    (requested,) = audit(runtime_engine, eid, "CANCEL_REQUESTED")
    assert (requested.actor, requested.detail["reason"]) == (OWNER, "too late")


@pytest.mark.parametrize("reason", ["", "  ", None])
def test_cancel_needs_a_reason(api: Api, runtime_engine: Engine, reason: str | None) -> None:
    eid = _pending(runtime_engine)
    body = {} if reason is None else {"reason": reason}

    response = api.post(f"/executions/{eid}/cancel", body, **REQUEST_OWNER)

    assert response.status_code == 422
    assert problem(response)["code"] == "BODY_INVALID"
    assert execution(runtime_engine, eid).status == "PENDING"


def _race_cancel_with_claim(api: Api, engine: Engine, eid: uuid.UUID) -> tuple[int, list[Any]]:
    """An owner's cancel and a worker's claim released at the same instant."""
    start = threading.Barrier(2)
    seen: dict[str, Any] = {}
    client = api.client()
    headers = api.headers(**REQUEST_OWNER)

    def claim() -> None:
        start.wait(10)
        with engine.connect() as conn:
            seen["claimed"] = [
                c.execution_id for c in claim_round(conn, "w", limit=5, lease_seconds=30).claims
            ]

    def cancel() -> None:
        start.wait(10)
        response = client.post(
            f"/api/v1/executions/{eid}/cancel", json={"reason": "race"}, headers=headers
        )
        seen["cancel"] = response.status_code

    threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return seen["cancel"], seen["claimed"]


def test_cancel_racing_a_claim_exactly_one_wins_and_a_cancelled_one_is_never_claimed(
    api: Api, runtime_engine: Engine
) -> None:
    for _ in range(5):
        eid = _pending(runtime_engine)

        cancel_status, claimed = _race_cancel_with_claim(api, runtime_engine, eid)

        row = execution(runtime_engine, eid)
        # Never 409 for a live execution: either the cancel ended it before any claim, or
        # the claim won and the cancel is recorded for its holder (the call is not cut).
        assert cancel_status == 200
        if not claimed:
            assert row.status == "CANCELLED"
        else:
            assert (claimed, row.status) == ([eid], "RUNNING")
            assert row.cancel_requested_by == OWNER
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w", limit=50, lease_seconds=30).claims == []


def test_a_claim_while_a_cancel_holds_the_row_takes_nothing_and_the_cancel_wins(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _pending(runtime_engine)
    inside, release = threading.Event(), threading.Event()
    app_engine = api.app.extensions[EXTENSION_KEY].engine.get()

    def hold_the_cancel_open(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any):
        # The cancel's last statement: its locks are held until the transaction ends.
        if isinstance(parameters, dict) and parameters.get("kind") == "EXECUTION_CANCELLED":
            inside.set()
            release.wait(20)

    event.listen(app_engine, "after_cursor_execute", hold_the_cancel_open)
    answers: dict[str, int] = {}
    client, headers = api.client(), api.headers(**REQUEST_OWNER)

    def cancel() -> None:
        response = client.post(
            f"/api/v1/executions/{eid}/cancel", json={"reason": "first"}, headers=headers
        )
        answers["cancel"] = response.status_code

    thread = threading.Thread(target=cancel)
    thread.start()
    try:
        assert inside.wait(20)
        with runtime_engine.connect() as conn:
            assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []
    finally:
        release.set()
        thread.join(20)
        event.remove(app_engine, "after_cursor_execute", hold_the_cancel_open)

    assert answers == {"cancel": 200}
    assert execution(runtime_engine, eid).status == "CANCELLED"
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []


def test_a_cancel_while_a_claim_holds_the_row_waits_and_is_recorded_for_the_holder(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    eid = _pending(runtime_engine)
    claimer = runtime_engine.connect()
    claiming = claimer.begin()
    claimed = claimer.execute(_CLAIM, {"limit": 1, "owner": "w", "lease_seconds": 30.0}).all()
    assert [row.id for row in claimed] == [eid]
    answers: dict[str, int] = {}
    client, headers = api.client(), api.headers(**REQUEST_OWNER)

    def cancel() -> None:
        response = client.post(
            f"/api/v1/executions/{eid}/cancel", json={"reason": "late"}, headers=headers
        )
        answers["cancel"] = response.status_code

    thread = threading.Thread(target=cancel)
    thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the cancel to queue")
    finally:
        claiming.commit()
        claimer.close()
    thread.join(20)

    assert answers == {"cancel": 200}
    row = execution(runtime_engine, eid)
    assert row.status == "RUNNING" and row.cancel_requested_at is not None


def _waiting_on_a_lock(owner_engine: Engine) -> bool:
    with owner_engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


# --- who may ---------------------------------------------------------------------------


def _operator_routes(eid: Any) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", f"/executions/{eid}/evidence", None),
        (
            "POST",
            f"/executions/{eid}/reconciliation",
            {"actionId": "charge", "decision": "retry", "reason": REASON},
        ),
        ("POST", f"/executions/{eid}/cancel", {"reason": REASON}),
    ]


def _call(api: Api, method: str, path: str, body: Any, **who: Any) -> Any:
    if method == "GET":
        return api.get(path, **who)
    return api.post(path, body, **who)


def test_another_organization_gets_the_byte_identical_404_on_every_route(
    api: Api, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    every_scope = [
        "executions:reconcile",
        "executions:cancel",
        "requests:read-all",
        "requests:write",
        "flows:admin",
    ]
    foreigner = {"org": OTHER_ORG, "sub": OPERATOR["sub"], "scopes": every_scope}
    insider = {"org": ORG, "sub": OPERATOR["sub"], "scopes": every_scope}

    for (method, path, body), (_, missing_path, _) in zip(
        _operator_routes(eid), _operator_routes(uuid.uuid4()), strict=True
    ):
        foreign = _call(api, method, path, body, **foreigner)
        missing = _call(api, method, missing_path, body, **insider)
        assert foreign.status_code == 404, path
        assert foreign.get_data() == missing.get_data(), path
    foreign_read = api.get(f"/executions/{eid}", **foreigner)
    missing_read = api.get(f"/executions/{uuid.uuid4()}", **insider)
    assert foreign_read.get_data() == missing_read.get_data()
    request_id = execution(runtime_engine, eid).request_id
    foreign_list = api.get(f"/executions?requestId={request_id}", **foreigner)
    missing_list = api.get(f"/executions?requestId={uuid.uuid4()}", **insider)
    assert foreign_list.status_code == 200
    assert foreign_list.get_data() == missing_list.get_data()
    assert foreign_list.get_json() == {"items": [], "next": None}
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


@pytest.mark.parametrize(
    "scopes",
    [["requests:read-all", "requests:write", "flows:admin", "executions:cancel"], []],
    ids=["everything-but-reconcile", "nothing"],
)
def test_evidence_and_decisions_need_executions_reconcile(
    api: Api, runtime_engine: Engine, scopes: list[str]
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))

    for method, path, body in _operator_routes(eid)[:2]:
        response = _call(api, method, path, body, org=ORG, sub=OPERATOR["sub"], scopes=scopes)
        assert response.status_code == 403, path
        assert problem(response)["code"] == "INSUFFICIENT_SCOPE"
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


def test_cancel_needs_executions_cancel_or_requests_write(api: Api, runtime_engine: Engine) -> None:
    eid = _pending(runtime_engine)
    operator_without_cancel = ["requests:read-all", "executions:reconcile"]

    response = api.post(
        f"/executions/{eid}/cancel",
        {"reason": "x"},
        org=ORG,
        sub=OWNER,
        scopes=operator_without_cancel,
    )

    assert response.status_code == 403
    assert problem(response)["code"] == "INSUFFICIENT_SCOPE"
    assert execution(runtime_engine, eid).status == "PENDING"
