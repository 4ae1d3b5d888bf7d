"""Schedules run any flow: by key or version, the transition they name, with the data as
the request's; their executions keep their machine; a person runs one now."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from api_support import Api, problem, running_api
from schedule_support import fires, make_due, put, schedule_flow, who
from sqlalchemy import Engine, text

from orquestador.automation.firing import fire_due_schedules

# A manual flow a person could start: reboot a machine, for a reason.
REBOOT: dict[str, Any] = {
    "key": "reboot",
    "trigger": "manual",
    "dataSchema": {
        "type": "object",
        "required": ["machineId"],
        "properties": {"machineId": {"type": "string"}, "reason": {"type": "string"}},
    },
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "go", "from": ["new"], "to": "done"}],
}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.scalar(text("SELECT clock_timestamp()"))


def _fire(engine: Engine, schedule_id: str) -> None:
    make_due(engine, schedule_id, _now(engine) - timedelta(seconds=1))
    while fire_due_schedules(engine, max_attempts=3):
        pass


def _request(engine: Engine, request_id: Any) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            text(
                "SELECT r.data, r.machine_id, r.flow_id, e.transition_id, f.version"
                " FROM request r JOIN execution e ON e.request_id = r.id"
                " JOIN flow f ON f.id = r.flow_id WHERE r.id = :id"
            ),
            {"id": request_id},
        ).one()


def test_a_manual_flow_by_key_fires_its_latest_version_with_the_schedule_s_data(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(REBOOT, **who())
    body = {
        "flow": "reboot",
        "transition": "go",
        "everySeconds": 3600,
        "data": {"machineId": "m-4", "reason": "weekly"},
    }
    answer = put(api, "weekly-reboot", body)
    assert answer.status_code == 201, answer.get_data(as_text=True)
    assert (answer.get_json()["flow"], answer.get_json()["flowKey"]) == ("reboot", "reboot")

    _fire(runtime_engine, "weekly-reboot")
    api.publish({**REBOOT, "states": ["new", "done", "spare"]}, **who())  # version 2
    _fire(runtime_engine, "weekly-reboot")

    first, second = (
        _request(runtime_engine, request)
        for _, request, _ in fires(runtime_engine, "weekly-reboot")
    )
    assert first.data == {"machineId": "m-4", "reason": "weekly"}  # the data itself
    assert (first.machine_id, first.transition_id, first.version) == ("m-4", "go", 1)
    assert (second.machine_id, second.version) == ("m-4", 2)


def test_a_schedule_flow_by_key_keeps_its_fire_data_and_its_executions_their_machine(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(schedule_flow(dataSchema=None), **who())
    answer = put(api, "tick", {"flow": "tick", "everySeconds": 60, "data": {"machineId": "m-5"}})
    assert answer.status_code == 201, answer.get_data(as_text=True)

    _fire(runtime_engine, "tick")

    [(_, request_id, _)] = fires(runtime_engine, "tick")
    fired = _request(runtime_engine, request_id)
    assert fired.data["scheduleId"] == "tick" and fired.data["data"] == {"machineId": "m-5"}
    assert (fired.machine_id, fired.transition_id) == ("m-5", "run")


def test_a_version_id_pins_the_version(api: Api, runtime_engine: Engine) -> None:
    first = api.publish(REBOOT, **who())["id"]
    api.publish({**REBOOT, "states": ["new", "done", "spare"]}, **who())

    body = {"flow": first, "transition": "go", "everySeconds": 60, "data": {"machineId": "m"}}
    answer = put(api, "pinned", body)
    _fire(runtime_engine, "pinned")

    assert answer.get_json()["flowKey"] is None and answer.get_json()["flowId"] == first
    [(_, request_id, _)] = fires(runtime_engine, "pinned")
    assert _request(runtime_engine, request_id).version == 1


def test_a_schedule_s_executions_are_found_by_their_machine(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(REBOOT, **who())
    body = {"flow": "reboot", "transition": "go", "everySeconds": 60, "data": {"machineId": "m-6"}}
    put(api, "often", body)
    _fire(runtime_engine, "often")
    [(_, _, execution_id)] = fires(runtime_engine, "often")

    listed = api.get("/executions?machineId=m-6", scopes=["requests:read-all"]).get_json()
    preview = api.post(
        "/executions/bulk",
        {"filter": {"machineId": "m-6"}, "action": "cancel", "reason": "r", "preview": True},
        scopes=["executions:cancel", "requests:read-all"],
    ).get_json()

    assert [item["id"] for item in listed["items"]] == [str(execution_id)]
    assert listed["items"][0]["machineId"] == "m-6"
    assert preview["count"] == 1


def test_run_now_fires_once_at_once_even_paused_and_leaves_the_timing_alone(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(REBOOT, **who())
    body = {
        "flow": "reboot",
        "transition": "go",
        "cron": "0 4 * * *",
        "data": {"machineId": "m-7"},
        "paused": True,
    }
    put(api, "nightly", body)

    ran = api.client().post("/api/v1/schedules/nightly/runs", headers=api.headers(**who()))

    assert ran.status_code == 201, ran.get_data(as_text=True)
    fired = ran.get_json()
    assert ran.headers["Location"] == f"/api/v1/executions/{fired['executionId']}"
    [(fire_time, request_id, execution_id)] = fires(runtime_engine, "nightly")
    assert (str(request_id), str(execution_id)) == (fired["requestId"], fired["executionId"])
    assert datetime.fromisoformat(fired["fireTime"]) == fire_time
    with runtime_engine.connect() as connection:
        accepted = connection.execute(
            text(
                "SELECT actor, detail->'startedBy' AS started FROM audit_event"
                " WHERE execution_id = :id AND kind = 'TRANSITION_ACCEPTED'"
            ),
            {"id": execution_id},
        ).one()
    assert accepted.actor == "alice" and accepted.started["schedule"] == "nightly"
    view = api.get("/schedules/nightly", **who()).get_json()
    assert (view["paused"], view["nextFireAt"], view["lastFiredAt"]) == (True, None, None)


def test_run_now_of_a_missing_schedule_or_refused_by_its_flow_writes_nothing(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(REBOOT, **who())
    body = {"flow": "reboot", "transition": "go", "everySeconds": 60, "data": {"machineId": "m"}}
    put(api, "s", body)
    # A newer version the schedule's data no longer satisfies.
    stricter = {**REBOOT, "dataSchema": {**REBOOT["dataSchema"], "required": ["machineId", "x"]}}
    api.publish(stricter, **who())

    missing = api.client().post("/api/v1/schedules/nope/runs", headers=api.headers(**who()))
    foreign = api.client().post(
        "/api/v1/schedules/s/runs", headers=api.headers(**who(org="org-other"))
    )
    refused = api.client().post("/api/v1/schedules/s/runs", headers=api.headers(**who()))

    assert missing.status_code == foreign.status_code == 404
    assert missing.get_data() == foreign.get_data()
    assert refused.status_code == 422 and problem(refused)["code"] == "DATA_INVALID"
    assert problem(refused)["problems"] == [
        {"path": "/data", "message": "'x' is a required property"}
    ]
    assert fires(runtime_engine, "s") == []


def _page_client(api: Api) -> Any:
    client = api.client()
    signed = client.post(
        "/ui/login",
        data={"token": api.token(scopes=[*who()["scopes"], "requests:read-all"])},
        headers={"Origin": "http://localhost"},
    )
    assert signed.status_code == 303
    return client


def _csrf(client: Any, page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get(page).get_data(as_text=True))
    assert found is not None
    return found.group(1)


def _words(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_schedules_page_pauses_resumes_runs_now_lists_and_deletes(
    api: Api, runtime_engine: Engine
) -> None:
    api.publish(REBOOT, **who())
    body = {"flow": "reboot", "transition": "go", "everySeconds": 60, "data": {"machineId": "m"}}
    put(api, "often", body)
    client = _page_client(api)
    token = _csrf(client, "/ui/schedules")
    origin = {"Origin": "http://localhost"}

    paused = client.post("/ui/schedules/often/pause", data={"csrf": token}, headers=origin)
    assert paused.status_code == 303
    page = client.get(paused.headers["Location"]).get_data(as_text=True)
    assert "The schedule is paused" in page and "Resume" in page
    assert api.get("/schedules/often", **who()).get_json()["paused"] is True

    resumed = client.post("/ui/schedules/often/resume", data={"csrf": token}, headers=origin)
    assert resumed.status_code == 303
    assert api.get("/schedules/often", **who()).get_json()["paused"] is False

    ran = client.post("/ui/schedules/often/run", data={"csrf": token}, headers=origin)
    assert ran.status_code == 303 and "/ui/executions/" in ran.headers["Location"]
    execution_page = _words(client.get(ran.headers["Location"]).get_data(as_text=True))
    assert "The schedule fired now" in execution_page
    assert "Started by schedule often , run now by alice" in execution_page
    [(_, _, execution_id)] = fires(runtime_engine, "often")
    listed = client.get("/ui/schedules/often").get_data(as_text=True)
    assert f"/ui/executions/{execution_id}" in listed

    refused = client.post("/ui/schedules/often/delete", data={}, headers=origin)
    assert refused.status_code == 403  # no CSRF token: nothing deleted
    deleted = client.post("/ui/schedules/often/delete", data={"csrf": token}, headers=origin)
    assert deleted.status_code == 303
    assert "The schedule was deleted" in client.get(deleted.headers["Location"]).get_data(
        as_text=True
    )
    assert api.get("/schedules/often", **who()).status_code == 404
    assert client.get("/ui/schedules/often").status_code == 404
