"""Finding things: the execution listing, the flow versions, and whether a request is busy."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, decommission, problem, running_api
from sqlalchemy import Engine, event, text

from orquestador.api.context import EXTENSION_KEY


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _accepted(api: Api, flow_id: str, **who: Any) -> dict[str, str]:
    request_id = api.create_request(flow_id, **who)["id"]
    response = api.transition(request_id, "power-off", 1, **who)
    assert response.status_code == 202, response.get_data(as_text=True)
    return {"requestId": request_id, "executionId": response.get_json()["executionId"]}


def _end(engine: Engine, execution_id: str, status: str) -> None:
    """What a worker leaves behind: a checkpoint, an ended attempt, an end status."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability,"
                " adapter_version, output, error_code)"
                " VALUES (:id, 'send', 'FAILED', 1, 1, 'hash', :key, 'NON_IDEMPOTENT_WRITE',"
                " 'machine.command', 1, NULL, 'TIMEOUT')"
            ),
            {"id": execution_id, "key": f"{execution_id}:send"},
        )
        connection.execute(
            text(
                "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                " status, error_code, message, started_at, finished_at)"
                " VALUES (:id, 'send', 1, 1, 'FAILED', 'TIMEOUT', 'no answer', now(), now())"
            ),
            {"id": execution_id},
        )
        connection.execute(
            text(
                "UPDATE execution SET status = :status, attempts = 1, finished_at = now()"
                " WHERE id = :id"
            ),
            {"id": execution_id, "status": status},
        )
        connection.execute(
            text("UPDATE request SET busy_execution_id = NULL WHERE busy_execution_id = :id"),
            {"id": execution_id},
        )


def _ids(body: dict[str, Any]) -> list[str]:
    return [item["id"] for item in body["items"]]


# --- the listing -----------------------------------------------------------------------


def test_the_owner_lists_their_executions_newest_first_and_read_all_lists_everyone_s(
    api: Api,
) -> None:
    flow_id = api.publish()["id"]
    mine = [_accepted(api, flow_id)["executionId"] for _ in range(3)]
    bobs = _accepted(api, flow_id, sub="bob")["executionId"]

    own = api.get("/executions").get_json()
    everyone = api.get("/executions", sub="auditor", scopes=["requests:read-all"]).get_json()

    assert _ids(own) == mine[::-1]
    assert own["next"] is None
    assert _ids(everyone) == [bobs, *mine[::-1]]
    first = own["items"][0]
    assert (first["status"], first["transitionId"], first["steps"]) == ("PENDING", "power-off", [])


def test_filters_by_status_flow_and_request(api: Api, owner_engine: Engine) -> None:
    first_flow = api.publish()["id"]
    second_flow = api.publish(decommission(key="other"))["id"]
    ended = _accepted(api, first_flow)
    pending = _accepted(api, first_flow)
    elsewhere = _accepted(api, second_flow)
    _end(owner_engine, ended["executionId"], "RECONCILIATION_REQUIRED")

    parked = api.get("/executions?status=RECONCILIATION_REQUIRED").get_json()
    waiting = api.get("/executions?status=PENDING").get_json()
    by_flow = api.get(f"/executions?flowId={second_flow}").get_json()
    by_request = api.get(f"/executions?requestId={pending['requestId']}").get_json()
    combined = api.get(f"/executions?flowId={first_flow}&status=PENDING").get_json()

    assert _ids(parked) == [ended["executionId"]]
    (step,) = parked["items"][0]["steps"]
    assert (step["actionId"], step["status"], step["attempts"][0]["message"]) == (
        "send",
        "FAILED",
        "no answer",
    )
    assert _ids(waiting) == [elsewhere["executionId"], pending["executionId"]]
    assert _ids(by_flow) == [elsewhere["executionId"]]
    assert _ids(by_request) == [pending["executionId"]]
    assert _ids(combined) == [pending["executionId"]]


def test_keyset_pages_walk_everything_once_even_while_new_executions_arrive(api: Api) -> None:
    flow_id = api.publish()["id"]
    created = [_accepted(api, flow_id)["executionId"] for _ in range(7)]

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        path = "/executions?limit=3" + (f"&after={cursor}" if cursor else "")
        page = api.get(path).get_json()
        seen += _ids(page)
        pages += 1
        if pages == 1:
            # Newer than every page still to come: it must not shift or repeat anything.
            _accepted(api, flow_id)
        cursor = page["next"]
        if cursor is None:
            break

    assert seen == created[::-1]
    assert pages == 3


def test_the_page_size_defaults_to_50_and_stops_at_200(api: Api, owner_engine: Engine) -> None:
    flow_id = api.publish()["id"]
    request_id = api.create_request(flow_id)["id"]
    # Many ended executions of one request, arranged directly: the API accepts one at a time.
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO execution (request_id, org_id, flow_id, transition_id, status,"
                " accepted_revision, accepted_state, actor_snapshot, finished_at)"
                " SELECT :request, 'org-a', :flow, 'power-off', 'FAILED', 1, 'new',"
                " '{}'::jsonb, now() FROM generate_series(1, 205)"
            ),
            {"request": request_id, "flow": flow_id},
        )

    default = api.get("/executions").get_json()
    largest = api.get("/executions?limit=200").get_json()
    rest = api.get(f"/executions?limit=200&after={largest['next']}").get_json()

    assert len(default["items"]) == 50 and default["next"]
    assert len(largest["items"]) == 200 and largest["next"]
    assert len(rest["items"]) == 5 and rest["next"] is None


def test_a_page_costs_the_same_queries_whatever_its_size(api: Api, owner_engine: Engine) -> None:
    flow_id = api.publish()["id"]
    first = _accepted(api, flow_id)["executionId"]
    _end(owner_engine, first, "FAILED")
    statements: list[str] = []
    engine = api.app.extensions[EXTENSION_KEY].engine.get()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        assert len(api.get("/executions").get_json()["items"]) == 1
        one = len(statements)
        for _ in range(5):
            _end(owner_engine, _accepted(api, flow_id)["executionId"], "FAILED")
        statements.clear()
        assert len(api.get("/executions").get_json()["items"]) == 6
        six = len(statements)
    finally:
        event.remove(engine, "before_cursor_execute", count)

    assert six == one


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("status=DONE", "/status"),
        # A filter the listing does not take is refused, never ignored.
        ("machine=m-1", "/machine"),
        ("status=WAITING&flow=decommission", "/flow"),
        ("status=", "/status"),
        ("limit=0", "/limit"),
        ("limit=201", "/limit"),
        ("limit=ten", "/limit"),
        ("limit=-1", "/limit"),
        ("flowId=flow-1", "/flowId"),
        ("requestId=%00", "/requestId"),
        ("after=not-a-cursor", "/after"),
        ("after=%F0%9F%98%80", "/after"),
        ("after=" + base64.urlsafe_b64encode(b"2030-01-01T00:00:00|x").decode(), "/after"),
        (
            "after="
            + base64.urlsafe_b64encode(b"yesterday|26813a60-7c92-4dc0-b784-b0777a19736f").decode(),
            "/after",
        ),
        ("after=" + "A" * 500, "/after"),
    ],
)
def test_a_malformed_query_is_a_400_naming_the_parameter(
    api: Api, query: str, parameter: str
) -> None:
    response = api.get(f"/executions?{query}")

    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "QUERY_INVALID"
    assert [p["path"] for p in body["problems"]] == [parameter]


@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_a_cursor_past_the_calendar_s_ends_is_a_400_not_a_server_error(api: Api, at: str) -> None:
    far = base64.urlsafe_b64encode(f"{at}|{uuid.uuid4()}".encode()).decode()

    response = api.get(f"/executions?after={far}")

    assert response.status_code == 400
    assert problem(response)["code"] == "QUERY_INVALID"


def test_another_organization_lists_nothing_of_ours(api: Api) -> None:
    flow_id = api.publish()["id"]
    accepted = _accepted(api, flow_id)

    listed = api.get(f"/executions?flowId={flow_id}", org=OTHER_ORG, scopes=["requests:read-all"])

    assert listed.status_code == 200
    assert listed.get_json() == {"items": [], "next": None}
    assert accepted["executionId"] not in listed.get_data(as_text=True)


def test_listing_needs_requests_read(api: Api) -> None:
    response = api.get("/executions", scopes=["requests:write", "flows:admin"])

    assert response.status_code == 403
    assert problem(response)["code"] == "INSUFFICIENT_SCOPE"


# --- flows -------------------------------------------------------------------------------


def test_flows_lists_every_version_by_key_newest_first(api: Api) -> None:
    first = api.publish()
    second = api.publish()
    other = api.publish(decommission(key="another"))
    api.publish(decommission(key="foreign"), org=OTHER_ORG)

    everything = api.get("/flows").get_json()
    one_key = api.get("/flows?key=decommission").get_json()

    assert [(f["key"], f["version"]) for f in everything["items"]] == [
        ("another", 1),
        ("decommission", 2),
        ("decommission", 1),
    ]
    assert [f["id"] for f in one_key["items"]] == [second["id"], first["id"]]
    item = everything["items"][0]
    assert set(item) == {"id", "key", "version", "trigger", "createdAt"}
    assert (item["id"], item["trigger"]) == (other["id"], "manual")
    assert api.get("/flows?key=nothing-like-it").get_json() == {"items": []}


@pytest.mark.parametrize("key", ["", "%00", "k" * 101])
def test_a_malformed_flow_key_is_a_400(api: Api, key: str) -> None:
    response = api.get(f"/flows?key={key}")

    assert response.status_code == 400
    assert problem(response)["code"] == "QUERY_INVALID"


def test_flows_listing_needs_flows_admin(api: Api) -> None:
    response = api.get("/flows", scopes=["requests:read-all", "requests:write"])

    assert response.status_code == 403


# --- the request view says when it is busy ------------------------------------------------


def test_the_request_says_whether_it_is_busy_and_with_which_execution(
    api: Api, owner_engine: Engine
) -> None:
    flow_id = api.publish()["id"]
    created = api.create_request(flow_id)
    assert (created["busy"], "busyExecutionId" in created) == (False, False)
    execution_id = api.transition(created["id"], "power-off", 1).get_json()["executionId"]

    busy = api.get(f"/requests/{created['id']}").get_json()
    _end(owner_engine, execution_id, "FAILED")
    free = api.get(f"/requests/{created['id']}").get_json()

    assert (busy["busy"], busy["busyExecutionId"], busy["executionId"]) == (
        True,
        execution_id,
        execution_id,
    )
    assert (free["busy"], free["executionId"]) == (False, execution_id)
    assert "busyExecutionId" not in free
