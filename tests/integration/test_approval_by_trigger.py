"""Self-approval by trigger: a request started by an event or a schedule records the token
that started it, and that token can never approve it, whatever scopes it holds."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from sqlalchemy import Engine

from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, problem
from tests.integration.approval_support import (  # the fixtures api, executor, registry
    approval_flow,
    builtins_api,  # noqa: F401
    builtins_executor,  # noqa: F401
    builtins_registry,  # noqa: F401
)
from tests.integration.automation_support import AUTOMATION_SCOPES, moment_flow
from tests.integration.worker_support import run_once

# One token that may both start work and decide approvals.
BOTH = [*AUTOMATION_SCOPES, "approvals:decide"]
APPROVERS = {"subjects": ["robot", "bob"]}


def _approval_transition(transition_id: str) -> dict[str, Any]:
    (asking,) = approval_flow(APPROVERS)["transitions"]
    return {**copy.deepcopy(asking), "id": transition_id}


def _only_open_approval(api: Api) -> str:
    listed = api.get("/approvals?status=open", sub="bob", scopes=["approvals:decide"])
    (item,) = listed.get_json()["items"]
    return item["id"]


def _decide_as_robot(api: Api, approval_id: str) -> Any:
    body = {"decision": "approved"}
    return api.post(f"/approvals/{approval_id}/decision", body, sub="robot", scopes=BOTH)


def test_a_token_cannot_approve_what_its_event_started(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    flow = moment_flow()
    flow["states"] = [*flow["states"], "rebooting", "refused", "timed-out"]
    flow["transitions"] = [_approval_transition("greet")]
    flow["dataSchema"]["properties"]["decidedBy"] = {"type": "string"}
    client = api.client()
    client.put("/api/v1/plans/vps", json={"name": "vps"}, headers=api.headers(scopes=BOTH))
    flow_id = api.publish(flow, sub="author", scopes=BOTH)["id"]
    bound = client.put(
        "/api/v1/plans/vps/bindings/provisioned",
        json={"flowId": flow_id},
        headers=api.headers(sub="author", scopes=BOTH),
    )
    assert bound.status_code == 200, bound.get_data(as_text=True)
    event = {
        "id": f"evt-{uuid.uuid4()}",
        "moment": "provisioned",
        "planId": "vps",
        "machineId": "m-42",
        "occurredAt": "2026-11-30T10:00:00+00:00",
        "data": {},
    }
    sent = client.post("/api/v1/events", json=event, headers=api.headers(sub="robot", scopes=BOTH))
    assert sent.status_code == 202, sent.get_data(as_text=True)
    assert run_once(runtime_engine, executor) == "WAITING"

    refused = _decide_as_robot(api, _only_open_approval(api))

    assert refused.status_code == 403 and problem(refused)["code"] == "SELF_APPROVAL"


def test_a_token_cannot_approve_what_its_schedule_started(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    flow = approval_flow(APPROVERS)
    api.publish(flow, sub="author", scopes=BOTH)
    body = {"flow": "reboot", "transition": "ask", "everySeconds": 3600, "data": {}}
    put = api.client().put(
        "/api/v1/schedules/nightly", json=body, headers=api.headers(sub="robot", scopes=BOTH)
    )
    assert put.status_code == 201, put.get_data(as_text=True)
    # Someone else runs it now: the schedule's fire is still the robot's doing.
    ran = api.client().post(
        "/api/v1/schedules/nightly/runs", headers=api.headers(sub="ops", scopes=BOTH)
    )
    assert ran.status_code == 201, ran.get_data(as_text=True)
    assert run_once(runtime_engine, executor) == "WAITING"

    refused = _decide_as_robot(api, _only_open_approval(api))

    assert refused.status_code == 403 and problem(refused)["code"] == "SELF_APPROVAL"
