"""Deciding a parked execution from its decision page: confirm (with the output) and fail
(to a state) do what the API does, audited with the person; without the scope nothing is
decided. Retry with a correction from the page is in test_reconcile_correction.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine

from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, running_api
from tests.integration.correction_support import DATA, OPERATOR, charge_double, park
from tests.integration.execution_page_support import HOST, signed_in, text_of
from tests.integration.worker_support import (
    ORG,
    audit,
    checkpoints,
    execution,
    registry_of,
    request_row,
    run_once,
    settings,
)

REASON = "the provider's dashboard shows charge ch_1 for 900 EUR"


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    registry = registry_of(charge_double())
    with running_api(database.runtime_dsn, registry=registry) as api:
        api.app.extensions[ADAPTERS_EXTENSION] = registry
        yield api


def _token(client: FlaskClient, page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get(page).get_data(as_text=True))
    assert found, f"no CSRF field on {page}"
    return found.group(1)


def _decide(client: FlaskClient, eid: uuid.UUID, **form: str) -> Any:
    return client.post(
        f"/ui/executions/{eid}/reconciliation",
        data={"csrf": _token(client, f"/ui/executions/{eid}"), "actionId": "charge", **form},
        headers={"Origin": HOST},
    )


def _everything(engine: Engine, eid: uuid.UUID) -> tuple[Any, ...]:
    """The rows a decision may write, whole: to prove a refusal wrote none of them."""
    run = execution(engine, eid)
    return (
        tuple(run),
        tuple(request_row(engine, run.request_id)),
        [tuple(row) for row in audit(engine, eid)],
        {key: tuple(row) for key, row in checkpoints(engine, eid).items()},
    )


def _words(client: FlaskClient, page: str) -> str:
    return unescape(text_of(client.get(page).get_data(as_text=True)))


def test_a_confirm_from_the_page_goes_on_from_the_checkpoint_and_shows_its_output(
    api: Api, runtime_engine: Engine
) -> None:
    charge = charge_double()
    eid = park(runtime_engine, charge)
    client = signed_in(api, **OPERATOR)
    assert "Confirm the step" in _words(client, f"/ui/executions/{eid}/reconcile")

    response = _decide(
        client, eid, decision="confirm", output='{"chargeId": "ch_1"}', reason=REASON
    )

    assert response.status_code == 303, response.get_data(as_text=True)
    assert response.headers["Location"] == f"/ui/executions/{eid}?done=reconciled-confirm"
    # As the API's confirm: the checkpoint holds the output, the execution is queued again.
    assert execution(runtime_engine, eid).status == "PENDING"
    assert checkpoints(runtime_engine, eid)["charge"].output == {"chargeId": "ch_1"}
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    assert (resolved.actor, resolved.detail["decision"]) == ("operator-1", "confirm")
    assert resolved.detail["reason"] == REASON
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    assert len(charge.calls) == 1  # the provider was not asked again
    words = _words(client, response.headers["Location"])
    assert "operator-1 confirmed step charge. Reason " + REASON in words
    assert 'Output {"chargeId": "ch_1"}' in words
    # A reader who may not decide sees the decision, not the step's output.
    reader = signed_in(api, **{**OPERATOR, "sub": "reader", "scopes": ["requests:read-all"]})
    words = _words(reader, f"/ui/executions/{eid}")
    assert "operator-1 confirmed step charge. Reason " + REASON in words
    assert "chargeId" not in words


def test_a_fail_from_the_page_ends_the_transition_in_the_chosen_state(
    api: Api, runtime_engine: Engine
) -> None:
    charge = charge_double()
    eid = park(runtime_engine, charge)
    client = signed_in(api, **OPERATOR)

    response = _decide(client, eid, decision="fail", toState="attention", reason=REASON)

    assert response.status_code == 303, response.get_data(as_text=True)
    assert response.headers["Location"] == f"/ui/executions/{eid}?done=reconciled-fail"
    run = execution(runtime_engine, eid)
    assert (run.status, run.result) == (
        "FAILED",
        {"outcome": "RECONCILED_FAILED", "toState": "attention"},
    )
    request = request_row(runtime_engine, run.request_id)
    assert (request.state, request.busy_execution_id, request.data) == ("attention", None, DATA)
    (resolved,) = audit(runtime_engine, eid, "RECONCILIATION_RESOLVED")
    (failed,) = audit(runtime_engine, eid, "TRANSITION_FAILED")
    assert (resolved.actor, resolved.detail["decision"]) == ("operator-1", "fail")
    assert (failed.actor, failed.detail["toState"]) == ("operator-1", "attention")
    assert len(charge.calls) == 1
    words = _words(client, response.headers["Location"])
    assert "The transition ended as failed." in words
    assert "operator-1 gave up on step charge." in words
    assert "operator-1 ended the transition as failed: the request is in attention." in words


@pytest.mark.parametrize(
    "form",
    [
        {"decision": "confirm", "output": '{"chargeId": "ch_1"}'},
        {"decision": "retry", "path1": "/amount", "value1": "950"},
        {"decision": "fail", "toState": "attention"},
    ],
    ids=["confirm", "retry", "fail"],
)
def test_without_the_scope_a_decision_from_the_page_is_refused_and_writes_nothing(
    api: Api, runtime_engine: Engine, form: dict[str, str]
) -> None:
    eid = park(runtime_engine, charge_double())
    # Reads every request of the organization, but decides nothing.
    reader = signed_in(api, org=ORG, sub="viewer", scopes=["requests:read-all"])
    before = _everything(runtime_engine, eid)

    response = _decide(reader, eid, reason=REASON, **form)

    assert response.status_code == 403
    assert "executions:reconcile" in response.get_data(as_text=True)
    assert _everything(runtime_engine, eid) == before
