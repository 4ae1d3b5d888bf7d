"""Creating and reading requests over HTTP, and who may see them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from sqlalchemy import Engine, text


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def flow_id(api: Api) -> str:
    return api.publish()["id"]


def test_create_answers_201_in_the_initial_state_owned_by_the_caller(
    api: Api, flow_id: str, runtime_engine: Engine
) -> None:
    response = api.post(
        "/requests", {"flowId": flow_id, "data": {"machineId": "m-1"}, "machineId": "m-1"}
    )

    assert response.status_code == 201
    body = response.get_json()
    assert body["flowId"] == flow_id
    assert (body["state"], body["revision"], body["data"]) == ("new", 1, {"machineId": "m-1"})
    assert response.headers["Location"] == f"/api/v1/requests/{body['id']}"
    with runtime_engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT org_id, owner_id, created_by, machine_id, busy_execution_id "
                "FROM request WHERE id = :id"
            ),
            {"id": body["id"]},
        ).one()
    assert tuple(row) == ("org-a", "alice", "alice", "m-1", None)


def test_data_is_checked_against_the_flow_schema_with_every_problem(api: Api, flow_id: str) -> None:
    response = api.post("/requests", {"flowId": flow_id, "data": {"power": 5}})

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "DATA_INVALID"
    messages = {p["path"]: p["message"] for p in body["problems"]}
    assert set(messages) == {"/data", "/data/power"}
    assert "machineId" in messages["/data"]


def test_data_over_256_kib_is_refused(api: Api, flow_id: str) -> None:
    data = {"machineId": "m-1", "power": "x" * (256 * 1024)}

    response = api.post("/requests", {"flowId": flow_id, "data": data})

    assert response.status_code == 422
    assert problem(response)["code"] == "DATA_INVALID"


def test_body_shape_errors_and_unknown_fields_are_422(api: Api, flow_id: str) -> None:
    response = api.post("/requests", {"flowId": flow_id, "data": [], "colour": "red"})

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "BODY_INVALID"
    paths = {p["path"] for p in body["problems"]}
    assert paths == {"/colour", "/data"}


# Fixed values: xdist workers must collect the same test ids.
@pytest.mark.parametrize("flow", ["not-a-uuid", "5fa8910b-34b7-4b60-aa4f-538bb434b728"])
def test_an_unknown_flow_is_422_on_flow_id(api: Api, flow: str) -> None:
    response = api.post("/requests", {"flowId": flow, "data": {}})

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "FLOW_UNKNOWN"
    assert body["problems"] == [{"path": "/flowId", "message": "no such flow in your organization"}]


def test_another_organizations_flow_cannot_start_a_request(api: Api, flow_id: str) -> None:
    response = api.post("/requests", {"flowId": flow_id, "data": {"machineId": "m"}}, org=OTHER_ORG)

    assert response.status_code == 422
    assert problem(response)["code"] == "FLOW_UNKNOWN"


def test_get_returns_the_request(api: Api, flow_id: str) -> None:
    created = api.create_request(flow_id)

    response = api.get(f"/requests/{created['id']}")

    assert response.status_code == 200
    assert response.get_json() == created
    assert "executionId" not in response.get_json()


def test_get_reports_the_busy_execution(api: Api, flow_id: str) -> None:
    created = api.create_request(flow_id)
    execution_id = api.transition(created["id"], "power-off", 1).get_json()["executionId"]

    body = api.get(f"/requests/{created['id']}").get_json()

    assert body["executionId"] == execution_id
    assert body["revision"] == 2


def test_get_reports_the_latest_execution_when_none_is_busy(
    api: Api, flow_id: str, owner_engine: Engine
) -> None:
    created = api.create_request(flow_id)
    execution_id = api.transition(created["id"], "power-off", 1).get_json()["executionId"]
    with owner_engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = 'FAILED' WHERE id = :id"), {"id": execution_id}
        )
        connection.execute(
            text("UPDATE request SET busy_execution_id = NULL WHERE id = :id"),
            {"id": created["id"]},
        )

    body = api.get(f"/requests/{created['id']}").get_json()

    assert body["executionId"] == execution_id


def test_foreign_and_missing_requests_are_byte_identical_404s(api: Api, flow_id: str) -> None:
    created = api.create_request(flow_id)

    missing = api.get(f"/requests/{uuid.uuid4()}")
    other_owner = api.get(f"/requests/{created['id']}", sub="bob")
    other_org = api.get(f"/requests/{created['id']}", org=OTHER_ORG)
    other_org_read_all = api.get(
        f"/requests/{created['id']}",
        org=OTHER_ORG,
        sub="alice",
        scopes=["requests:read", "requests:read-all"],
    )
    malformed = api.get("/requests/not-a-uuid")

    assert missing.status_code == 404
    problem(missing)
    for response in (other_owner, other_org, other_org_read_all, malformed):
        assert response.status_code == 404
        assert response.get_data() == missing.get_data()
        assert response.headers["Content-Type"] == missing.headers["Content-Type"]


def test_read_all_sees_other_owners_in_the_same_organization(api: Api, flow_id: str) -> None:
    created = api.create_request(flow_id)

    response = api.get(f"/requests/{created['id']}", sub="auditor", scopes=["requests:read-all"])

    assert response.status_code == 200
    assert response.get_json()["id"] == created["id"]


def test_request_routes_need_their_scopes(api: Api, flow_id: str) -> None:
    created = api.create_request(flow_id)

    create = api.post(
        "/requests", {"flowId": flow_id, "data": {"machineId": "m"}}, scopes=["requests:read"]
    )
    read = api.get(f"/requests/{created['id']}", scopes=["requests:write"])
    transition = api.transition(created["id"], "power-off", 1, scopes=["requests:read"])

    assert create.status_code == read.status_code == transition.status_code == 403
