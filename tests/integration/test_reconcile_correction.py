"""Retry with a correction: the request data patched in the retry's own transaction."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import Effect, UncertainError
from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.errors import DecisionInvalid
from orquestador.queue import Resolution, resolve
from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, problem, running_api
from tests.integration.correction_support import (
    CHECKOUT_SCHEMA,
    DATA,
    OPERATOR,
    REASON,
    charge_double,
    park,
)
from tests.integration.execution_page_support import HOST, signed_in, text_of
from tests.integration.worker_support import (
    ORG,
    action,
    audit,
    checkpoints,
    execution,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)
from tests.integration.worker_support import RecordingAdapter as Double


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    registry = registry_of(charge_double())
    with running_api(database.runtime_dsn, registry=registry) as api:
        api.app.extensions[ADAPTERS_EXTENSION] = registry
        yield api


def _retry(api: Api, eid: Any, correction: Any, **who: Any) -> Any:
    body = {"actionId": "charge", "decision": "retry", "reason": REASON, "correction": correction}
    return api.post(f"/executions/{eid}/reconciliation", body, **{**OPERATOR, **who})


def _everything(engine: Engine, eid: uuid.UUID) -> tuple[Any, ...]:
    """The rows a decision may write, whole: to prove a refusal wrote none of them."""
    run = execution(engine, eid)
    return (
        tuple(run),
        tuple(request_row(engine, run.request_id)),
        [tuple(row) for row in audit(engine, eid)],
        {key: tuple(row) for key, row in checkpoints(engine, eid).items()},
    )


def test_the_retried_step_runs_with_the_corrected_data_and_the_audit_keeps_then_and_now(
    api: Api, runtime_engine: Engine
) -> None:
    charge = charge_double({"chargeId": "ch_1"})
    eid = park(runtime_engine, charge)
    accepted = execution(runtime_engine, eid).accepted_revision

    response = _retry(
        api,
        eid,
        [{"path": "/amount", "value": 950}, {"path": "/note", "value": "confirmed by phone"}],
    )

    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["status"] == "PENDING"
    run = execution(runtime_engine, eid)
    request = request_row(runtime_engine, run.request_id)
    assert request.data == {**DATA, "amount": 950, "note": "confirmed by phone"}
    assert request.revision == run.accepted_revision == accepted + 1
    assert request.busy_execution_id == eid
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.actor == "operator-1"
    assert resolved.detail["decision"] == "retry"
    assert resolved.detail["correction"] == [
        {"path": "/amount", "before": 900, "after": 950},
        {"path": "/note", "after": "confirmed by phone"},
    ]
    assert resolved.detail["correctedRevision"] == accepted + 1

    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    first, retried = charge.calls
    assert first.inputs == {"amount": 900, "currency": "EUR"}
    assert retried.inputs == {"amount": 950, "currency": "EUR"}
    assert retried.external_key == first.external_key
    finished = request_row(runtime_engine, run.request_id)
    assert (finished.state, finished.revision, finished.busy_execution_id) == (
        "done",
        accepted + 2,
        None,
    )
    assert finished.data["amount"] == 950

    evidence = api.get(f"/executions/{eid}/evidence", **OPERATOR).get_json()
    shown = next(e for e in evidence["audit"] if e["kind"] == "RECONCILIATION_RESOLVED")
    assert shown["detail"]["correction"][0] == {"path": "/amount", "before": 900, "after": 950}


@pytest.mark.parametrize(
    ("correction", "code", "paths"),
    [
        pytest.param([{"path": "amount", "value": 950}], "CORRECTION_INVALID",
                     ["/correction/0/path"], id="not-a-pointer"),
        pytest.param([{"path": "/data/amount", "value": 950}], "CORRECTION_INVALID",
                     ["/correction/0/path"], id="a-property-the-schema-does-not-have"),
        pytest.param([{"path": "/amount/cents", "value": 5}], "CORRECTION_INVALID",
                     ["/correction/0/path"], id="inside-a-number"),
        pytest.param([{"path": "/lines/3/sku", "value": "b"}], "CORRECTION_INVALID",
                     ["/correction/0/path"], id="past-the-end-of-an-array"),
        pytest.param([{"path": "/note", "value": "ok"}, {"path": "/amount", "value": "950"}],
                     "CORRECTION_INVALID", ["/correction/1/value"], id="breaks-the-schema"),
        pytest.param([{"path": "/currency", "value": "GBP"}, {"path": "/amount", "value": 0}],
                     "CORRECTION_INVALID", ["/correction/0/value", "/correction/1/value"],
                     id="two-values-the-schema-refuses"),
        pytest.param([{"path": "/amount", "value": 1}, {"path": "/amount", "value": 2}],
                     "CORRECTION_INVALID", ["/correction/1/path"], id="the-same-path-twice"),
        pytest.param([{"path": "/note", "value": "x" * (256 * 1024)}], "CORRECTION_INVALID",
                     ["/correction/0/value"], id="too-large"),
        pytest.param([], "BODY_INVALID", ["/correction"], id="empty"),
        pytest.param([{"path": "/amount"}], "BODY_INVALID", ["/correction/0"], id="no-value"),
        pytest.param([{"path": "/note", "value": str(n)} for n in range(51)], "BODY_INVALID",
                     ["/correction"], id="more-than-50-paths"),
    ],
)  # fmt: skip
def test_a_refused_correction_is_422_with_its_paths_and_writes_nothing(
    api: Api, runtime_engine: Engine, correction: Any, code: str, paths: list[str]
) -> None:
    charge = charge_double()
    eid = park(runtime_engine, charge)
    before = _everything(runtime_engine, eid)

    response = _retry(api, eid, correction)

    assert response.status_code == 422, response.get_data(as_text=True)
    found = problem(response)
    assert found["code"] == code
    assert sorted({p["path"] for p in found["problems"]}) == paths
    assert _everything(runtime_engine, eid) == before
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


@pytest.mark.parametrize("decision", ["confirm", "fail"])
def test_only_a_retry_takes_a_correction(api: Api, runtime_engine: Engine, decision: str) -> None:
    eid = park(runtime_engine, charge_double())
    before = _everything(runtime_engine, eid)
    body: dict[str, Any] = {
        "actionId": "charge",
        "decision": decision,
        "reason": REASON,
        "correction": [{"path": "/amount", "value": 950}],
    }
    if decision == "confirm":
        body["output"] = {"chargeId": "ch_1"}

    response = api.post(f"/executions/{eid}/reconciliation", body, **OPERATOR)

    assert response.status_code == 422
    found = problem(response)
    assert found["code"] == "BODY_INVALID"
    assert [p["path"] for p in found["problems"]] == ["/correction"]
    assert _everything(runtime_engine, eid) == before

    # The protocol refuses it too, for callers that are not this route.
    refused = Resolution(
        execution_id=eid,
        org_id=ORG,
        actor="operator-1",
        decision=decision,
        reason=REASON,
        action_id="charge",
        output=body.get("output"),
        correction=(("/amount", 950),),
    )
    with runtime_engine.connect() as conn, pytest.raises(DecisionInvalid) as invalid:
        resolve(conn, refused, output_problems=lambda *_: [], claims_budget=10)
    assert (invalid.value.code, invalid.value.paths) == ("CORRECTION_INVALID", ["/correction"])
    assert _everything(runtime_engine, eid) == before


def test_a_request_changed_since_acceptance_is_not_corrected(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    eid = park(runtime_engine, charge_double())
    request_id = execution(runtime_engine, eid).request_id
    with owner_engine.begin() as conn:  # what only a defect or a hand-written UPDATE does
        conn.execute(
            text("UPDATE request SET revision = revision + 1 WHERE id = :id"), {"id": request_id}
        )
    before = _everything(runtime_engine, eid)

    response = _retry(api, eid, [{"path": "/amount", "value": 950}])

    assert response.status_code == 409
    assert problem(response)["code"] == "NOT_RECONCILABLE"
    assert "no longer as its transition accepted it" in problem(response)["detail"]
    assert _everything(runtime_engine, eid) == before
    # The decision page does not pretend to know the data the execution accepted.
    then, _ = _data_then_and_now(signed_in(api, **OPERATOR), eid)
    assert then.endswith(
        "Not known: the request changed in a way no correction of this execution explains."
    )


def test_two_corrected_retries_at_once_exactly_one_is_applied(
    api: Api, runtime_engine: Engine
) -> None:
    eid = park(runtime_engine, charge_double())
    accepted = execution(runtime_engine, eid).accepted_revision
    start = threading.Barrier(2)
    answers: dict[int, int] = {}

    def decide(amount: int) -> None:
        client = api.client()
        headers = api.headers(**{**OPERATOR, "sub": f"operator-{amount}"})
        body = {
            "actionId": "charge",
            "decision": "retry",
            "reason": REASON,
            "correction": [{"path": "/amount", "value": amount}],
        }
        start.wait(10)
        response = client.post(
            f"/api/v1/executions/{eid}/reconciliation", json=body, headers=headers
        )
        answers[amount] = response.status_code

    threads = [threading.Thread(target=decide, args=(amount,)) for amount in (950, 990)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(answers.values()) == [200, 409]
    winner = next(amount for amount, status in answers.items() if status == 200)
    run = execution(runtime_engine, eid)
    request = request_row(runtime_engine, run.request_id)
    assert request.data["amount"] == winner
    assert request.revision == run.accepted_revision == accepted + 1
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert resolved.actor == f"operator-{winner}"
    assert resolved.detail["correction"] == [{"path": "/amount", "before": 900, "after": winner}]


# --- from the page ---------------------------------------------------------------------


def test_an_operator_retries_with_a_correction_from_the_page(
    api: Api, runtime_engine: Engine
) -> None:
    eid = park(runtime_engine, charge_double())
    client = signed_in(api, **OPERATOR)
    form_page = client.get(f"/ui/executions/{eid}/reconcile")
    html = form_page.get_data(as_text=True)
    assert form_page.status_code == 200, html
    words = unescape(text_of(html))
    assert "The step in doubt is charge" in words and '"amount": 900' in words
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert token is not None
    form = {
        "csrf": token.group(1),
        "decision": "retry",
        "actionId": "charge",
        "reason": REASON,
        "path1": "/amount",
        "value1": "950",
    }
    before = _everything(runtime_engine, eid)

    forged = client.post(
        f"/ui/executions/{eid}/reconciliation", data={**form, "csrf": ""}, headers={"Origin": HOST}
    )
    refused = client.post(
        f"/ui/executions/{eid}/reconciliation",
        data={**form, "value1": '"a lot"'},
        headers={"Origin": HOST},
    )
    unread = client.post(
        f"/ui/executions/{eid}/reconciliation",
        data={**form, "value1": "lots", "path2": "/note", "value2": "by phone"},
        headers={"Origin": HOST},
    )
    assert forged.status_code == 403 and refused.status_code == 422
    # Said next to the field, in words, with everything typed kept; no bare error page.
    html = refused.get_data(as_text=True)
    assert re.search(r'id="value1-problem">[^<]*integer', html), html
    assert 'value="&#34;a lot&#34;"' in html and f">{REASON}</textarea>" in html
    assert unread.status_code == 422
    html = unread.get_data(as_text=True)
    assert (
        'id="value1-problem">/amount takes a whole number such as 950, not the text '
        "&#34;lots&#34;</p>"
    ) in html
    assert 'value="by phone"' in html and "value2-problem" not in html
    assert _everything(runtime_engine, eid) == before

    # A text field takes its text as typed, without JSON quotes.
    response = client.post(
        f"/ui/executions/{eid}/reconciliation",
        data={**form, "path2": "/note", "value2": "by phone"},
        headers={"Origin": HOST},
    )

    assert response.status_code == 303
    assert response.headers["Location"] == f"/ui/executions/{eid}?done=reconciled-retry"
    run = execution(runtime_engine, eid)
    data = request_row(runtime_engine, run.request_id).data
    assert (data["amount"], data["note"]) == (950, "by phone")
    page = text_of(client.get(response.headers["Location"]).get_data(as_text=True))
    assert "operator-1 asked for a retry of step charge with a correction" in page
    assert "Corrected /amount 900 → 950" in page


def _data_then_and_now(client: Any, eid: uuid.UUID) -> tuple[str, str]:
    """The words of the decision page's then and now of the request data."""
    page = client.get(f"/ui/executions/{eid}/reconcile").get_data(as_text=True)
    found = re.search(
        r'<section class="request-data">.*?<section class="then">(.*?)</section>'
        r'\s*<section class="now">(.*?)</section>',
        page,
        re.S,
    )
    assert found, "no then and now of the request data"
    # text_of leaves a space where a tag ended, before a comma or a colon too.
    then, now = (
        re.sub(r" ([,:])", r"\1", re.sub(r"\s+", " ", unescape(text_of(part)))).strip()
        for part in found.groups()
    )
    return then, now


def test_the_decision_page_shows_the_data_as_accepted_beside_the_data_now(
    api: Api, runtime_engine: Engine
) -> None:
    charge = charge_double(UncertainError("reset again"))
    eid = park(runtime_engine, charge)
    client = signed_in(api, **OPERATOR)

    then, now = _data_then_and_now(client, eid)
    assert then.endswith("Revision 2: the same as now. Nothing has changed it since.")
    assert now.startswith("Now In new, revision 2.") and '"amount": 900' in now

    # A corrected retry that parks again: then is still the data the execution accepted.
    assert _retry(api, eid, [{"path": "/amount", "value": 950}]).status_code == 200
    executor = Executor(registry_of(charge), settings())
    assert run_once(runtime_engine, executor) == "RECONCILIATION_REQUIRED"
    then, now = _data_then_and_now(client, eid)

    assert "Revision 2." in then and '"amount": 900' in then and '"amount": 950' not in then
    assert "revision 3." in now and '"amount": 950' in now
    assert "Corrected since: /amount: 900 → 950" in now


def test_the_reconcile_page_is_for_holders_of_the_scope(api: Api, runtime_engine: Engine) -> None:
    eid = park(runtime_engine, charge_double())
    reader = signed_in(api, org=ORG, scopes=["requests:read-all"])

    assert reader.get(f"/ui/executions/{eid}/reconcile").status_code == 403
    page = reader.get(f"/ui/executions/{eid}").get_data(as_text=True)
    assert f"/ui/executions/{eid}/reconcile" not in page


# --- what a finished step read ----------------------------------------------------------


def _say_then_charge(engine: Engine, say: Any, charge: Any) -> uuid.UUID:
    """A step that reads /note and succeeds, then the charge, in doubt: parked."""
    definition = flow_definition(
        [
            action("say", "test.say", input={"text": {"format": "Note: {/data/note}"}}),
            action(
                "charge",
                "test.charge",
                input={"amount": {"from": "/data/amount"}, "currency": {"from": "/data/currency"}},
            ),
        ],
        data_schema=CHECKOUT_SCHEMA,
    )
    eid = start_execution(engine, definition, {**DATA, "note": "as ordered"})
    executor = Executor(registry_of(say, charge), settings())
    assert run_once(engine, executor) == "RECONCILIATION_REQUIRED"
    return eid


def test_a_correction_of_what_a_finished_step_read_is_refused_and_writes_nothing(
    api: Api, runtime_engine: Engine
) -> None:
    say = Double("test.say", Effect.READ_ONLY, output={"said": True})
    charge = charge_double({"chargeId": "ch_1"})
    api.app.extensions[ADAPTERS_EXTENSION] = registry_of(say, charge)
    eid = _say_then_charge(runtime_engine, say, charge)
    before = _everything(runtime_engine, eid)

    response = _retry(
        api, eid, [{"path": "/amount", "value": 950}, {"path": "/note", "value": "by phone"}]
    )

    assert response.status_code == 422, response.get_data(as_text=True)
    found = problem(response)
    assert found["code"] == "CORRECTION_INVALID"
    (refused,) = found["problems"]
    assert refused["path"] == "/correction/1/path"
    assert "step 'say' already succeeded" in refused["message"]
    assert _everything(runtime_engine, eid) == before
    # The page says it beside the row that changes it.
    client = signed_in(api, **OPERATOR)
    html = client.get(f"/ui/executions/{eid}/reconcile").get_data(as_text=True)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert token is not None
    form = {"csrf": token.group(1), "decision": "retry", "actionId": "charge", "reason": REASON}
    page = client.post(
        f"/ui/executions/{eid}/reconciliation",
        data={**form, "path1": "/note", "value1": "by phone"},
        headers={"Origin": HOST},
    )
    assert page.status_code == 422
    assert re.search(r'id="path1-problem">step &#39;say&#39; already succeeded', page.text), (
        page.text
    )
    assert _everything(runtime_engine, eid) == before

    # A correction of what only the step in doubt reads goes on: the finished step is
    # not run again, its checkpoint still describes what it read.
    assert _retry(api, eid, [{"path": "/amount", "value": 950}]).status_code == 200
    executor = Executor(registry_of(say, charge), settings())
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert len(say.calls) == 1
    assert [call.inputs for call in charge.calls][-1] == {"amount": 950, "currency": "EUR"}
