"""Publishing and reading flows over HTTP, on a real database as the runtime role."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from api_support import DECOMMISSION, OTHER_ORG, Api, decommission, problem, running_api
from sqlalchemy import Engine, text


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def test_publish_answers_201_with_location_and_stores_the_definition(
    api: Api, runtime_engine: Engine
) -> None:
    response = api.post("/flows", DECOMMISSION)

    assert response.status_code == 201
    body = response.get_json()
    assert set(body) == {"id", "key", "version", "trigger"}
    assert (body["key"], body["version"], body["trigger"]) == ("decommission", 1, "manual")
    assert response.headers["Location"] == f"/api/v1/flows/{body['id']}"
    with runtime_engine.connect() as connection:
        row = connection.execute(
            text("SELECT org_id, created_by, definition, data_schema FROM flow WHERE id = :id"),
            {"id": body["id"]},
        ).one()
    assert (row.org_id, row.created_by) == ("org-a", "alice")
    assert row.definition == DECOMMISSION
    assert row.data_schema == DECOMMISSION["dataSchema"]


def test_publishing_a_key_again_adds_a_version_and_keeps_the_old_row(api: Api) -> None:
    first = api.publish()
    second = api.publish(decommission(states=["new", "off", "attention", "gone"]))

    assert (first["version"], second["version"]) == (1, 2)
    assert first["id"] != second["id"]
    old = api.get(f"/flows/{first['id']}").get_json()
    assert old["definition"] == DECOMMISSION
    assert old["version"] == 1


def test_versions_count_per_organization(api: Api) -> None:
    assert api.publish()["version"] == 1
    assert api.publish(org=OTHER_ORG)["version"] == 1
    assert api.publish()["version"] == 2


def test_concurrent_publishes_of_one_key_get_distinct_versions(api: Api) -> None:
    threads = 8
    barrier = threading.Barrier(threads)
    versions: list[int] = []
    statuses: list[int] = []
    headers = api.headers()

    def publish() -> None:
        client = api.client()
        barrier.wait()
        response = client.post("/api/v1/flows", json=DECOMMISSION, headers=headers)
        statuses.append(response.status_code)
        if response.status_code == 201:
            versions.append(response.get_json()["version"])

    workers = [threading.Thread(target=publish) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert statuses == [201] * threads
    assert sorted(versions) == list(range(1, threads + 1))


def test_invalid_definition_lists_every_problem_with_its_path(api: Api) -> None:
    definition = decommission(initialState="nowhere")
    transition = definition["transitions"][0]
    transition["from"] = ["limbo"]
    transition["actions"][0]["capability"] = "acme.unknown"
    transition["actions"][1]["id"] = "send"

    response = api.post("/flows", definition)

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "FLOW_INVALID"
    paths = {p["path"] for p in body["problems"]}
    assert {
        "/initialState",
        "/transitions/0/from/0",
        "/transitions/0/actions/0/capability",
        "/transitions/0/actions/1/id",
    } <= paths
    assert all(p["message"] for p in body["problems"])


def test_schema_and_semantic_problems_come_back_together(api: Api) -> None:
    definition = decommission(initialState="nowhere")
    del definition["trigger"]
    definition["transitions"][0]["actions"][0]["capability"] = "acme.unknown"

    response = api.post("/flows", definition)

    assert response.status_code == 422
    assert problem(response)["problems"] == [
        {"path": "", "message": "'trigger' is a required property"},
        {"path": "/initialState", "message": "unknown state 'nowhere'"},
        {
            "path": "/transitions/0/actions/0/capability",
            "message": "unknown capability acme.unknown version 1",
        },
    ]


def test_a_flow_without_data_schema_or_actions_publishes_and_takes_any_object(
    api: Api, runtime_engine: Engine
) -> None:
    definition = {
        "key": "bare",
        "trigger": "manual",
        "initialState": "open",
        "states": ["open", "closed"],
        "transitions": [{"id": "close", "from": ["open"], "to": "closed"}],
    }

    response = api.post("/flows", definition)

    assert response.status_code == 201, response.get_data(as_text=True)
    flow_id = response.get_json()["id"]
    with runtime_engine.connect() as connection:
        row = connection.execute(
            text("SELECT definition, data_schema FROM flow WHERE id = :id"), {"id": flow_id}
        ).one()
    assert row.definition == definition
    assert row.data_schema == {"type": "object"}
    created = api.create_request(flow_id, {"anything": [1, "two", {"three": None}]})
    assert api.transition(created["id"], "close", 1).status_code == 202


def test_a_flow_naming_a_dry_run_only_adapter_is_refused_at_its_path(database) -> None:
    definition = {
        "key": "noop-flow",
        "trigger": "manual",
        "initialState": "open",
        "states": ["open", "closed"],
        "transitions": [
            {
                "id": "close",
                "from": ["open"],
                "actions": [{"id": "n", "capability": "noop", "version": 1, "input": {}}],
                "to": "closed",
            }
        ],
    }
    # The registry this API is configured with: the built-ins, NO_OP among them.
    with running_api(database.runtime_dsn, registry=None) as api:
        response = api.post("/flows", definition)

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "FLOW_INVALID"
    assert body["problems"] == [
        {
            "path": "/transitions/0/actions/0/capability",
            "message": "noop version 1 only simulates and never runs for real;"
            " a published flow cannot use it",
        }
    ]


def test_definition_shape_errors_and_unknown_fields_are_422(api: Api) -> None:
    response = api.post("/flows", {"key": "x", "surprise": 1})

    body = problem(response)
    assert response.status_code == 422
    assert body["code"] == "FLOW_INVALID"
    assert body["problems"]


def test_warnings_come_back_with_the_created_flow(api: Api) -> None:
    definition = decommission()
    definition["transitions"][0]["actions"][0]["email"] = True

    response = api.post("/flows", definition)

    assert response.status_code == 201
    assert response.get_json()["warnings"] == [
        {
            "path": "/transitions/0/actions/0/email",
            "message": "email only applies to notify and approval actions",
        }
    ]


def test_publishing_warns_of_a_state_no_path_reaches(api: Api) -> None:
    """What `flows lint` finds about paths, publishing says too, without refusing."""
    definition = decommission()
    definition["states"].append("limbo")

    response = api.post("/flows", definition)

    assert response.status_code == 201
    assert response.get_json()["warnings"] == [
        {
            "path": f"/states/{len(definition['states']) - 1}",
            "message": "no transition reaches state 'limbo' from 'new'",
        }
    ]


def test_get_flow_returns_definition_and_metadata(api: Api) -> None:
    created = api.publish()

    response = api.get(f"/flows/{created['id']}")

    assert response.status_code == 200
    body = response.get_json()
    assert body["id"] == created["id"]
    assert body["key"] == "decommission"
    assert body["version"] == 1
    assert body["trigger"] == "manual"
    assert body["createdBy"] == "alice"
    assert body["createdAt"].endswith("Z")
    assert body["definition"] == DECOMMISSION


def test_another_organizations_flow_is_the_same_404_as_a_missing_one(api: Api) -> None:
    created = api.publish()

    foreign = api.get(f"/flows/{created['id']}", org=OTHER_ORG)
    missing = api.get(f"/flows/{uuid.uuid4()}")

    assert foreign.status_code == missing.status_code == 404
    assert foreign.get_data() == missing.get_data()


def test_flow_routes_need_the_admin_scope(api: Api) -> None:
    created = api.publish()
    scopes = ["requests:read", "requests:write", "requests:read-all"]

    publish = api.post("/flows", DECOMMISSION, scopes=scopes)
    read = api.get(f"/flows/{created['id']}", scopes=scopes)

    assert publish.status_code == read.status_code == 403
    assert problem(publish)["code"] == "INSUFFICIENT_SCOPE"
