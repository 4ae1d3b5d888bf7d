"""The agent API over HTTP: each agent sees only its own machine's commands in its own org."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from api_support import ORG, OTHER_ORG, Api, problem, running_api
from sqlalchemy import Engine, text

from orquestador.machines import create_command


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def agent(api: Api, machine: str = "m-1", org: str = ORG) -> dict[str, str]:
    return api.headers(sub=f"machine:{machine}", org=org, scopes=["agent"])


def command(engine: Engine, machine: str = "m-1", org: str = ORG, key: str | None = None) -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=org,
            machine_id=machine,
            command="poweroff",
            args=["--now"],
            external_key=key or f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def take(api: Api, headers: dict[str, str], wait: str = "0"):
    return api.client().post(f"/api/v1/agent/commands/next?wait={wait}", headers=headers)


def report(api: Api, headers: dict[str, str], command_id: str, **body):
    return api.client().post(
        f"/api/v1/agent/commands/{command_id}/status", json=body, headers=headers
    )


def status_of(engine: Engine, command_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()


def test_the_agent_takes_its_command_once_then_gets_204(api: Api, runtime_engine: Engine) -> None:
    command_id = command(runtime_engine)

    first = take(api, agent(api))
    second = take(api, agent(api))

    assert first.status_code == 200
    assert first.get_json() == {"id": command_id, "command": "poweroff", "args": ["--now"]}
    assert status_of(runtime_engine, command_id) == "sent"
    assert second.status_code == 204 and second.get_data() == b""


def test_another_machine_or_organization_never_sees_the_command(
    api: Api, runtime_engine: Engine
) -> None:
    command_id = command(runtime_engine)
    strangers = [agent(api, machine="m-2"), agent(api, org=OTHER_ORG)]

    for headers in strangers:
        assert take(api, headers).status_code == 204
    assert take(api, agent(api)).status_code == 200
    for headers in strangers:
        refused = report(api, headers, command_id, status="running")
        assert refused.status_code == 404
        missing = report(api, headers, str(uuid.uuid4()), status="running")
        assert refused.get_data() == missing.get_data()
    assert status_of(runtime_engine, command_id) == "sent"


def test_statuses_move_forward_and_a_different_final_status_is_409(
    api: Api, runtime_engine: Engine
) -> None:
    command_id = command(runtime_engine)
    headers = agent(api)
    assert report(api, headers, command_id, status="running").status_code == 409  # not sent
    take(api, headers)

    running = report(api, headers, command_id, status="running")
    done = report(api, headers, command_id, status="succeeded", exitCode=0, output="bye")
    again = report(api, headers, command_id, status="succeeded", exitCode=0)
    other = report(api, headers, command_id, status="failed", exitCode=1)
    backwards = report(api, headers, command_id, status="running")

    assert running.status_code == 200 and running.get_json()["status"] == "running"
    assert done.status_code == 200
    assert done.get_json()["status"] == "succeeded" and done.get_json()["exitCode"] == 0
    assert again.status_code == 200 and again.get_json()["changed"] is False
    for refused in (other, backwards):
        assert refused.status_code == 409
        assert problem(refused)["code"] == "STATUS_CONFLICT"
    assert status_of(runtime_engine, command_id) == "succeeded"


def test_a_token_that_is_no_machine_is_refused(api: Api, runtime_engine: Engine) -> None:
    command(runtime_engine)

    person = take(api, api.headers(sub="alice", scopes=["agent"]))
    no_scope = take(api, api.headers(sub="machine:m-1"))

    assert person.status_code == 403 and problem(person)["code"] == "NOT_A_MACHINE"
    assert no_scope.status_code == 403 and problem(no_scope)["code"] == "INSUFFICIENT_SCOPE"


@pytest.mark.parametrize("wait", ["-1", "31", "nan", "soon"])
def test_a_wait_out_of_bounds_is_400(api: Api, wait: str) -> None:
    refused = take(api, agent(api), wait=wait)

    assert refused.status_code == 400
    assert problem(refused)["problems"] == [{"path": "/wait", "message": "seconds from 0 to 30"}]


def test_a_bad_status_body_is_422_and_changes_nothing(api: Api, runtime_engine: Engine) -> None:
    command_id = command(runtime_engine)
    headers = agent(api)
    take(api, headers)

    for body in ({"status": "sent"}, {"status": "succeeded", "exitCode": "0"}, {"extra": 1}):
        refused = report(api, headers, command_id, **body)
        assert refused.status_code == 422, body
    assert status_of(runtime_engine, command_id) == "sent"


def test_a_long_poll_over_http_answers_when_the_command_arrives(
    api: Api, runtime_engine: Engine
) -> None:
    answers: list = []
    started = threading.Event()
    headers = agent(api)

    def poll() -> None:
        started.set()
        answers.append(take(api, headers, wait="20"))

    poller = threading.Thread(target=poll)
    poller.start()
    assert started.wait(5)
    command_id = command(runtime_engine)
    poller.join(10)

    assert not poller.is_alive()
    assert answers[0].status_code == 200 and answers[0].get_json()["id"] == command_id
