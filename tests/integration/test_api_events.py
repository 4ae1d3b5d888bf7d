"""POST /events: the bound flow starts for the machine, exactly once per event id."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from automation_support import AUTOMATION_SCOPES, count, moment_flow
from sqlalchemy import Engine, text

from orquestador.serve import serve_in_thread

EVENT = {
    "id": "evt-1",
    "moment": "provisioned",
    "planId": "vps",
    "machineId": "m-42",
    "occurredAt": "2026-11-30T10:00:00+00:00",
    "data": {"hostname": "web-1"},
}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _headers(api: Api, **who: Any) -> dict[str, str]:
    return api.headers(scopes=AUTOMATION_SCOPES, **who)


def _post_event(api: Api, event: dict[str, Any], **who: Any):
    return api.client().post("/api/v1/events", json=event, headers=_headers(api, **who))


def _bind(api: Api, flow: dict[str, Any] | None = None, plan: str = "vps", **who: Any) -> str:
    client = api.client()
    client.put(f"/api/v1/plans/{plan}", json={"name": plan}, headers=_headers(api, **who))
    flow_id = api.publish(flow or moment_flow(), scopes=AUTOMATION_SCOPES, **who)["id"]
    moment = (flow or moment_flow())["trigger"]
    bound = client.put(
        f"/api/v1/plans/{plan}/bindings/{moment}",
        json={"flowId": flow_id},
        headers=_headers(api, **who),
    )
    assert bound.status_code == 200, bound.get_data(as_text=True)
    return flow_id


def _event_row(engine: Engine, event_id: str, org: str = "org-a"):
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT * FROM platform_event WHERE org_id = :org AND id = :id"),
            {"org": org, "id": event_id},
        ).one()


def test_a_provisioning_event_starts_the_bound_flow_for_that_machine(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = _bind(api)
    listener = runtime_engine.connect()
    listener.execute(text("LISTEN orquestador_execution_ready"))
    listener.commit()

    response = _post_event(api, EVENT)

    assert response.status_code == 202, response.get_data(as_text=True)
    body = response.get_json()
    assert body["eventId"] == "evt-1"
    assert response.headers["Location"] == f"/api/v1/executions/{body['executionId']}"
    with runtime_engine.connect() as connection:
        request = connection.execute(
            text("SELECT * FROM request WHERE id = :id"), {"id": body["requestId"]}
        ).one()
        execution = connection.execute(
            text("SELECT * FROM execution WHERE id = :id"), {"id": body["executionId"]}
        ).one()
        audit = connection.execute(
            text("SELECT kind, actor, detail FROM audit_event WHERE execution_id = :id"),
            {"id": body["executionId"]},
        ).one()
    assert (str(request.flow_id), request.org_id, request.machine_id) == (flow_id, "org-a", "m-42")
    assert request.owner_id == "alice"
    assert request.data == {
        "machineId": "m-42",
        "planId": "vps",
        "event": {
            "id": "evt-1",
            "moment": "provisioned",
            "occurredAt": "2026-11-30T10:00:00+00:00",
            "data": {"hostname": "web-1"},
        },
    }
    assert (request.state, request.revision) == ("new", 2)
    assert str(request.busy_execution_id) == body["executionId"]
    assert (execution.status, execution.transition_id, execution.simulation) == (
        "PENDING",
        "greet",
        False,
    )
    assert execution.accepted_revision == 2
    assert audit.kind == "TRANSITION_ACCEPTED"
    assert audit.detail["transitionId"] == "greet"
    row = _event_row(runtime_engine, "evt-1")
    assert row.outcome == "STARTED"
    assert (str(row.request_id), str(row.execution_id)) == (body["requestId"], body["executionId"])
    assert row.processed_at is not None
    # Workers are woken as for any accepted transition.
    notifies = list(listener.connection.driver_connection.notifies(timeout=1, stop_after=1))
    assert [n.channel for n in notifies] == ["orquestador_execution_ready"]
    listener.close()

    # The started execution is readable where Location says.
    seen = api.client().get(response.headers["Location"], headers=_headers(api))
    assert seen.status_code == 200
    assert seen.get_json()["transitionId"] == "greet"


def test_the_same_event_id_again_answers_the_first_answer(api: Api, runtime_engine: Engine) -> None:
    _bind(api)
    first = _post_event(api, EVENT)
    # The same body, its keys in another order and its date in another offset: the same event.
    again = _post_event(
        api, {**dict(reversed(EVENT.items())), "occurredAt": "2026-11-30T11:00:00+01:00"}
    )

    assert again.status_code == 202
    assert again.get_json() == first.get_json()
    assert again.headers["Location"] == first.headers["Location"]
    assert count(runtime_engine, "execution") == 1
    assert count(runtime_engine, "request") == 1


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"machineId": "m-other"}, ["machineId"]),
        ({"data": {"hostname": "web-2"}}, ["data"]),
        ({"moment": "deleted", "occurredAt": None}, ["moment", "occurredAt"]),
    ],
)
def test_a_reused_event_id_with_another_body_is_flagged_and_changes_nothing(
    api: Api, runtime_engine: Engine, change: dict[str, Any], fields: list[str]
) -> None:
    _bind(api)
    first = _post_event(api, EVENT)
    other = {k: v for k, v in {**EVENT, **change}.items() if v is not None}

    response = _post_event(api, other)

    # The recorded event's answer, flagged: this body is not the event the id stands for.
    assert response.status_code == 202
    assert response.get_json() == {**first.get_json(), "differsFromRecorded": fields}
    # The first delivery stands, and is still answered to its own body.
    assert _post_event(api, EVENT).get_json() == first.get_json()
    row = _event_row(runtime_engine, EVENT["id"])
    assert (row.machine_id, row.data) == (EVENT["machineId"], EVENT["data"])
    assert count(runtime_engine, "execution") == 1


def test_sixteen_concurrent_deliveries_start_one_execution(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)
    server, _ = serve_in_thread(api.app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_port}/api/v1/events"
    headers = {**_headers(api), "Content-Type": "application/json"}
    barrier = threading.Barrier(16)
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def deliver() -> None:
        request = urllib.request.Request(
            url, data=json.dumps(EVENT).encode(), headers=headers, method="POST"
        )
        barrier.wait(timeout=30)
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = (response.status, json.loads(response.read()))
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=deliver) for _ in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
    finally:
        server.shutdown()

    assert len(answers) == 16
    assert {status for status, _ in answers} == {202}
    assert len({tuple(sorted(body.items())) for _, body in answers}) == 1
    assert count(runtime_engine, "execution") == 1
    assert count(runtime_engine, "request") == 1
    assert count(runtime_engine, "platform_event") == 1


def test_an_event_for_a_plan_without_a_binding_is_recorded_and_starts_nothing(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)  # binds provisioned only
    deleted = {**EVENT, "id": "evt-del", "moment": "deleted"}
    unknown_plan = {**EVENT, "id": "evt-nop", "planId": "no-such-plan"}

    for event, plan in ((deleted, "unbound"), (unknown_plan, "unknown")):
        response = _post_event(api, event)
        assert response.status_code == 200
        assert response.get_json() == {
            "eventId": event["id"],
            "started": False,
            "reason": "NO_BINDING",
            "plan": plan,
        }
        assert _post_event(api, event).get_json() == response.get_json()
        row = _event_row(runtime_engine, event["id"])
        assert (row.outcome, row.request_id, row.execution_id) == ("NO_BINDING", None, None)
        assert row.processed_at is not None
    assert count(runtime_engine, "execution") == 0


def test_an_event_whose_data_the_flow_refuses_is_recorded_rejected(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)
    refused = {**EVENT, "id": "evt-long", "data": {"hostname": "h" * 50}}

    response = _post_event(api, refused)

    assert response.status_code == 200
    body = response.get_json()
    assert (body["started"], body["reason"]) == (False, "REJECTED")
    assert [p["path"] for p in body["problems"]] == ["/event/data/hostname"]
    assert _post_event(api, refused).get_json() == body
    assert _event_row(runtime_engine, "evt-long").outcome == "REJECTED"
    assert count(runtime_engine, "execution") == 0
    assert count(runtime_engine, "request") == 0


def test_event_ids_are_per_organization_and_plans_too(api: Api, runtime_engine: Engine) -> None:
    _bind(api)
    theirs = _post_event(api, EVENT, org=OTHER_ORG)
    assert theirs.status_code == 200
    assert theirs.get_json()["reason"] == "NO_BINDING"
    mine = _post_event(api, EVENT)
    assert mine.status_code == 202
    assert count(runtime_engine, "execution") == 1


def test_bad_events_are_clear_problems_and_record_nothing(api: Api, runtime_engine: Engine) -> None:
    cases = [
        ({**EVENT, "moment": "installed"}, "/moment"),
        ({**EVENT, "occurredAt": "yesterday"}, "/occurredAt"),
        ({**EVENT, "occurredAt": "2026-11-30T10:00:00"}, "/occurredAt"),
        ({key: value for key, value in EVENT.items() if key != "machineId"}, ""),
        ({**EVENT, "id": ""}, "/id"),
        ({**EVENT, "data": [1]}, "/data"),
    ]
    for event, path in cases:
        response = _post_event(api, event)
        assert response.status_code == 422, event
        assert path in [p["path"] for p in problem(response)["problems"]]
    assert count(runtime_engine, "platform_event") == 0


def test_events_need_the_events_write_scope(api: Api) -> None:
    response = api.client().post(
        "/api/v1/events", json=EVENT, headers=api.headers(scopes=["plans:admin"])
    )
    assert response.status_code == 403


def test_publishing_a_moment_flow_without_start_is_refused_at_its_path(api: Api) -> None:
    response = api.post("/flows", moment_flow(start=None), scopes=AUTOMATION_SCOPES)
    assert response.status_code == 422
    assert [p["path"] for p in problem(response)["problems"]] == ["/start"]


def test_a_bound_flow_stored_before_start_was_required_rejects_its_events(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    flow_id = _bind(api)
    with owner_engine.begin() as connection:
        # As a flow published by an older version looks: no "start".
        connection.execute(
            text("UPDATE flow SET definition = definition - 'start' WHERE id = :id"),
            {"id": flow_id},
        )

    response = _post_event(api, EVENT)

    assert response.status_code == 200
    assert response.get_json()["reason"] == "REJECTED"
    assert [p["path"] for p in response.get_json()["problems"]] == ["/start"]
    assert count(runtime_engine, "execution") == 0


@pytest.mark.parametrize(
    "body",
    [
        # Valid JSON nested far past any limit: refused before anything recursive reads it.
        '{"id": "evt-deep", "moment": "provisioned", "planId": "vps", "machineId": "m-1",'
        ' "data": {"deep": ' + "[" * 10_000 + "]" * 10_000 + "}}",
        '{"id": "evt-nul", "moment": "provisioned", "planId": "vps", "machineId": "m-1",'
        ' "data": {"hostname": "web\\u0000"}}',
        '{"id": "evt-nul", "moment": "provisioned", "planId": "vps", "machineId": "m-1",'
        ' "data": {"host\\u0000name": "web-1"}}',
        '{"id": "evt\\u0000", "moment": "provisioned", "planId": "vps", "machineId": "m-1"}',
    ],
    ids=["nested-10000-deep", "nul-in-a-string", "nul-in-a-key", "nul-in-the-id"],
)
def test_a_deep_or_nul_holding_body_is_a_4xx_problem_and_records_nothing(
    api: Api, runtime_engine: Engine, body: str
) -> None:
    _bind(api)

    response = api.client().post(
        "/api/v1/events", data=body, content_type="application/json", headers=_headers(api)
    )

    assert 400 <= response.status_code < 500, response.get_data(as_text=True)
    assert problem(response)["code"] in ("MALFORMED_JSON", "BODY_INVALID")
    assert count(runtime_engine, "platform_event") == 0
    assert count(runtime_engine, "request") == 0


def test_asking_about_a_poison_row_the_platform_inserted_answers_why_it_was_rejected(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)
    with runtime_engine.begin() as connection:
        # The platform's own insert: PostgreSQL stores data nested 10,000 deep, which
        # Python cannot read back.
        connection.execute(
            text(
                "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, data)"
                " VALUES ('org-a', 'evt-deep', 'provisioned', 'vps', 'm-1', CAST(:data AS jsonb))"
            ),
            {"data": '{"deep": ' + "[" * 10_000 + "]" * 10_000 + "}"},
        )

    response = _post_event(api, {**EVENT, "id": "evt-deep"})

    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert (body["started"], body["reason"]) == (False, "REJECTED")
    assert body["problems"] == [{"path": "/event/data", "message": "nests deeper than 64 levels"}]
    # Asked with a body of its own, not the stored one: the answer says so.
    assert body["differsFromRecorded"] == ["machineId", "occurredAt", "data"]
    assert _post_event(api, {**EVENT, "id": "evt-deep"}).get_json() == body
    with runtime_engine.connect() as connection:
        outcome = connection.execute(
            text("SELECT outcome FROM platform_event WHERE id = 'evt-deep'")
        ).scalar_one()
    assert outcome == "REJECTED"
    assert count(runtime_engine, "request") == 0
