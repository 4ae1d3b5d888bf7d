"""Flow keys wherever a flow version id is taken: the latest version of the key to start
something (a request, a dry run, a binding), every version of it to filter (bulk actions)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from api_support import OTHER_ORG, Api, decommission, problem, running_api
from sqlalchemy import Engine

from tests.integration.worker_support import execution, request_row


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


OPERATOR = ["requests:read", "requests:write", "flows:admin", "executions:cancel"]


def test_a_flow_is_read_by_its_key_as_its_latest_version(api: Api) -> None:
    api.publish()
    newest = api.publish(decommission(priority=3))

    by_key = api.get("/flows/decommission")
    by_id = api.get(f"/flows/{newest['id']}")

    assert by_key.status_code == 200
    assert (by_key.get_json()["id"], by_key.get_json()["version"]) == (newest["id"], 2)
    assert by_key.get_json() == by_id.get_json()


def test_a_key_of_another_organization_or_none_is_the_same_404(api: Api) -> None:
    api.publish(org=OTHER_ORG)

    foreign = api.get("/flows/decommission")
    missing = api.get("/flows/no-such-key")
    too_long = api.get(f"/flows/{'k' * 101}")

    assert foreign.status_code == missing.status_code == too_long.status_code == 404
    assert foreign.get_data() == missing.get_data() == too_long.get_data()


def test_a_request_created_by_key_starts_on_the_latest_version(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish()
    newest = api.publish()

    created = api.post("/requests", {"flowId": "decommission", "data": {"machineId": "m-1"}})
    foreign = api.post(
        "/requests", {"flowId": "decommission", "data": {"machineId": "m-1"}}, org=OTHER_ORG
    )

    assert created.status_code == 201, created.get_data(as_text=True)
    assert created.get_json()["flowId"] == newest["id"]
    assert foreign.status_code == 422 and problem(foreign)["code"] == "FLOW_UNKNOWN"
    request = request_row(runtime_engine, uuid.UUID(created.get_json()["id"]))
    assert str(request.flow_id) == newest["id"]


def test_a_dry_run_by_key_runs_the_latest_version(api: Api, runtime_engine: Engine) -> None:
    api.publish()
    newest = api.publish()
    body = {"transition": "power-off", "data": {"machineId": "m-1"}}

    started = api.post("/flows/decommission/dry-runs", body)
    missing = api.post("/flows/no-such-key/dry-runs", body)

    assert started.status_code == 202, started.get_data(as_text=True)
    dry = execution(runtime_engine, uuid.UUID(started.get_json()["executionId"]))
    assert (str(dry.flow_id), dry.simulation) == (newest["id"], True)
    assert missing.status_code == 404


def test_a_bulk_filter_by_key_takes_every_version_of_it(api: Api) -> None:
    first = api.publish()
    api.publish()
    other = api.publish(decommission(key="reboot"))
    for flow in (first["id"], "decommission", other["id"]):
        request = api.post("/requests", {"flowId": flow, "data": {"machineId": "m-1"}})
        accepted = api.transition(request.get_json()["id"], "power-off", 1)
        assert accepted.status_code == 202
    body = {"filter": {"flowKey": "decommission"}, "action": "cancel", "reason": "outage"}

    preview = api.post("/executions/bulk", {**body, "preview": True}, scopes=OPERATOR)
    one_version = api.post(
        "/executions/bulk",
        {**body, "filter": {"flowId": first["id"]}, "preview": True},
        scopes=OPERATOR,
    )

    assert preview.status_code == 200, preview.get_data(as_text=True)
    assert preview.get_json()["count"] == 2
    assert {item["flowVersion"] for item in preview.get_json()["sample"]} == {1, 2}
    assert one_version.get_json()["count"] == 1


def test_a_plan_binds_the_latest_version_of_a_key(api: Api) -> None:
    moment = {
        "key": "welcome",
        "trigger": "provisioned",
        "start": "greet",
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [{"id": "greet", "from": ["new"], "to": "done"}],
    }
    api.publish(moment)
    newest = api.publish(moment)
    admin = ["plans:admin"]
    assert api.client().put(
        "/api/v1/plans/p-1", json={"name": "Plan"}, headers=api.headers(scopes=admin)
    ).status_code in (200, 201)

    bound = api.client().put(
        "/api/v1/plans/p-1/bindings/provisioned",
        json={"flowId": "welcome"},
        headers=api.headers(scopes=admin),
    )
    unknown = api.client().put(
        "/api/v1/plans/p-1/bindings/provisioned",
        json={"flowId": "nobody"},
        headers=api.headers(scopes=admin),
    )

    assert bound.status_code == 200, bound.get_data(as_text=True)
    assert bound.get_json()["bindings"]["provisioned"] == newest["id"]
    assert unknown.status_code == 404
