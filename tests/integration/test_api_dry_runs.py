"""POST /flows/{id}/dry-runs: a simulated request and execution, validated like real ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, decommission, problem, running_api
from automation_support import count
from sqlalchemy import Engine, text


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _dry_run(api: Api, flow_id: str, body: dict[str, Any], **who: Any):
    return api.post(f"/flows/{flow_id}/dry-runs", body, **who)


def test_a_dry_run_queues_a_simulated_execution_on_a_simulated_request(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = api.publish()["id"]

    response = _dry_run(api, flow_id, {"data": {"machineId": "m-7"}, "transition": "power-off"})

    assert response.status_code == 202, response.get_data(as_text=True)
    body = response.get_json()
    assert body["simulation"] is True
    assert response.headers["Location"] == f"/api/v1/executions/{body['executionId']}"
    with runtime_engine.connect() as connection:
        request = connection.execute(
            text("SELECT * FROM request WHERE id = :id"), {"id": body["requestId"]}
        ).one()
        execution = connection.execute(
            text("SELECT * FROM execution WHERE id = :id"), {"id": body["executionId"]}
        ).one()
        audit = connection.execute(
            text("SELECT kind FROM audit_event WHERE execution_id = :id"),
            {"id": body["executionId"]},
        ).scalar_one()
    assert request.simulation is True
    assert (request.org_id, request.owner_id, request.state, request.revision) == (
        "org-a",
        "alice",
        "new",
        2,
    )
    assert request.data == {"machineId": "m-7"}
    assert execution.simulation is True
    assert (execution.status, execution.transition_id, execution.org_id) == (
        "PENDING",
        "power-off",
        "org-a",
    )
    assert audit == "TRANSITION_ACCEPTED"
    # The caller reads it where Location says.
    seen = api.client().get(response.headers["Location"], headers=api.headers())
    assert seen.status_code == 200
    assert seen.get_json()["transitionId"] == "power-off"


def test_a_dry_run_may_start_in_another_state(api: Api, runtime_engine: Engine) -> None:
    flow_id = api.publish()["id"]
    body = {"data": {"machineId": "m-7"}, "transition": "retry", "state": "attention"}
    response = _dry_run(api, flow_id, body)
    assert response.status_code == 202
    with runtime_engine.connect() as connection:
        state = connection.execute(
            text("SELECT accepted_state FROM execution WHERE id = :id"),
            {"id": response.get_json()["executionId"]},
        ).scalar_one()
    assert state == "attention"


@pytest.mark.parametrize(
    ("body", "code", "path"),
    [
        ({"data": {}, "transition": "power-off"}, "DATA_INVALID", "/data"),
        ({"data": {"machineId": 5}, "transition": "power-off"}, "DATA_INVALID", "/data/machineId"),
        ({"data": {"machineId": "m"}, "transition": "jump"}, "TRANSITION_UNKNOWN", "/transition"),
        (
            {"data": {"machineId": "m"}, "transition": "retry"},
            "TRANSITION_NOT_ALLOWED",
            "/transition",
        ),
        (
            {"data": {"machineId": "m"}, "transition": "retry", "state": "gone"},
            "STATE_UNKNOWN",
            "/state",
        ),
        ({"data": {"machineId": "m"}}, "BODY_INVALID", ""),
        ({"data": {"machineId": "m"}, "transition": "power-off", "x": 1}, "BODY_INVALID", "/x"),
    ],
)
def test_bad_dry_runs_are_422_and_write_nothing(
    api: Api, runtime_engine: Engine, body: dict[str, Any], code: str, path: str
) -> None:
    flow_id = api.publish()["id"]
    response = _dry_run(api, flow_id, body)
    assert response.status_code == 422
    refused = problem(response)
    assert refused["code"] == code
    assert path in [p["path"] for p in refused["problems"]]
    assert count(runtime_engine, "request") == 0
    assert count(runtime_engine, "execution") == 0


def test_another_organizations_flow_is_404_and_the_scope_is_flows_admin(api: Api) -> None:
    theirs = api.publish(decommission(), org=OTHER_ORG)["id"]
    body = {"data": {"machineId": "m"}, "transition": "power-off"}
    foreign = _dry_run(api, theirs, body)
    missing = _dry_run(api, "00000000-0000-4000-8000-000000000000", body)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.get_data() == missing.get_data()
    mine = api.publish()["id"]
    assert _dry_run(api, mine, body, scopes=["requests:write"]).status_code == 403
