"""Starting a real run in one call: a flow key or version id, its transition, the data."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, decommission, problem, running_api
from sqlalchemy import Engine, text

from tests.integration.worker_support import audit, execution, request_row


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def run(api: Api, flow: str, transition: str = "power-off", **fields: Any) -> Any:
    body = {"flow": flow, "transition": transition, "data": {"machineId": "m-1"}, **fields}
    return api.post("/runs", body)


def requests_written(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM request")).scalar_one()


def test_a_run_by_key_starts_the_latest_version_and_answers_where_to_follow_it(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish()
    newest = api.publish(decommission(priority=7))

    response = run(api, "decommission")

    assert response.status_code == 202, response.get_data(as_text=True)
    body = response.get_json()
    assert (body["flowId"], body["flowKey"], body["flowVersion"]) == (
        newest["id"],
        "decommission",
        2,
    )
    assert response.headers["Location"] == f"/api/v1/executions/{body['executionId']}"
    started = execution(runtime_engine, uuid.UUID(body["executionId"]))
    assert (started.status, started.transition_id, started.priority) == ("PENDING", "power-off", 7)
    request = request_row(runtime_engine, uuid.UUID(body["requestId"]))
    assert (request.state, request.revision, request.busy_execution_id) == (
        "new",
        2,
        uuid.UUID(body["executionId"]),
    )
    (accepted,) = audit(runtime_engine, started.id, "TRANSITION_ACCEPTED")
    assert accepted.actor == "alice"
    assert api.get(f"/executions/{body['executionId']}").get_json()["flowVersion"] == 2


def test_a_run_by_version_id_starts_that_version_with_the_priority_asked(
    api: Api, runtime_engine: Engine
) -> None:
    first = api.publish()
    api.publish()

    response = run(api, first["id"], priority=9, machineId="m-7")

    assert response.status_code == 202
    body = response.get_json()
    assert (body["flowId"], body["flowVersion"]) == (first["id"], 1)
    assert execution(runtime_engine, uuid.UUID(body["executionId"])).priority == 9
    assert request_row(runtime_engine, uuid.UUID(body["requestId"])).machine_id == "m-7"


@pytest.mark.parametrize(
    ("change", "status", "code", "path"),
    [
        ({"flow": "no-such-flow"}, 422, "FLOW_UNKNOWN", "/flow"),
        ({"flow": "5fa8910b-34b7-4b60-aa4f-538bb434b728"}, 422, "FLOW_UNKNOWN", "/flow"),
        ({"transition": "nope"}, 422, "TRANSITION_UNKNOWN", "/transition"),
        ({"transition": "retry"}, 422, "TRANSITION_NOT_ALLOWED", "/transition"),
        ({"data": {"power": 5}}, 422, "DATA_INVALID", "/data/power"),
        ({"priority": 10}, 422, "BODY_INVALID", "/priority"),
        ({"colour": "red"}, 422, "BODY_INVALID", "/colour"),
    ],
    ids=[
        "unknown-key",
        "unknown-id",
        "transition",
        "not-from-initial",
        "data",
        "priority",
        "field",
    ],
)
def test_a_refused_run_says_where_and_writes_nothing(
    api: Api,
    runtime_engine: Engine,
    change: dict[str, Any],
    status: int,
    code: str,
    path: str,
) -> None:
    api.publish()
    body = {"flow": "decommission", "transition": "power-off", "data": {"machineId": "m-1"}}

    response = api.post("/runs", {**body, **change})

    assert response.status_code == status
    found = problem(response)
    assert found["code"] == code
    assert path in {p["path"] for p in found["problems"]}
    assert requests_written(runtime_engine) == 0


def test_a_concurrency_key_the_data_lacks_is_refused_before_anything_is_written(
    api: Api, runtime_engine: Engine
) -> None:
    keyed = decommission(dataSchema={"type": "object"})
    keyed["transitions"][0]["concurrency"] = {"key": "/data/machineId"}
    api.publish(keyed)

    response = api.post("/runs", {"flow": "decommission", "transition": "power-off", "data": {}})

    assert response.status_code == 422
    found = problem(response)
    assert found["code"] == "CONCURRENCY_KEY_MISSING"
    assert [p["path"] for p in found["problems"]] == ["/data/machineId"]
    assert requests_written(runtime_engine) == 0


def test_another_organizations_flow_is_unknown_by_key_and_by_id(api: Api) -> None:
    theirs = api.publish(org=OTHER_ORG)

    by_key = run(api, "decommission")
    by_id = run(api, theirs["id"])

    for response in (by_key, by_id):
        assert response.status_code == 422
        assert problem(response)["code"] == "FLOW_UNKNOWN"
    assert by_key.get_data() == by_id.get_data()


def test_a_run_needs_requests_write(api: Api) -> None:
    api.publish()
    body = {"flow": "decommission", "transition": "power-off", "data": {"machineId": "m-1"}}

    refused = api.post("/runs", body, scopes=["requests:read", "flows:admin"])

    assert refused.status_code == 403
    assert problem(refused)["code"] == "INSUFFICIENT_SCOPE"
