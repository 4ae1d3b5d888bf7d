"""Machines in the API and their agents' liveness: polls and reports say an agent is alive,
the status is worked out when read, and every reader sees the same."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.machines import create_command
from orquestador.metrics import AGENTS_OFFLINE
from orquestador.worker.maintenance import MaintenanceLoop, PassReport
from tests.integration.api_support import ORG, Api, problem, running_api
from tests.integration.worker_support import settings

READER = ["machines:admin"]


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def poll(api: Api, machine: str, org: str = ORG) -> int:
    headers = api.headers(sub=f"machine:{machine}", org=org, scopes=["agent"])
    return api.client().post("/api/v1/agent/commands/next?wait=0", headers=headers).status_code


def send(engine: Engine, machine: str, org: str = ORG) -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=org,
            machine_id=machine,
            command="reboot",
            args=["--now"],
            external_key=f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def silent_for(engine: Engine, machine: str, seconds: int) -> None:
    """The agent's last sign of life moves `seconds` into the past, as silence would."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE machine_agent SET last_seen_at = now() - make_interval(secs => :s)"
                " WHERE machine_id = :m"
            ),
            {"s": seconds, "m": machine},
        )


def last_seen(engine: Engine, machine: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT last_seen_at FROM machine_agent WHERE machine_id = :m"), {"m": machine}
        ).scalar_one()


def test_a_poll_is_a_sign_of_life_written_at_most_once_per_ten_seconds(
    api: Api, owner_engine: Engine
) -> None:
    assert poll(api, "m-1") == 204
    first = last_seen(owner_engine, "m-1")
    assert poll(api, "m-1") == 204
    assert last_seen(owner_engine, "m-1") == first  # within 10 s: nothing written

    silent_for(owner_engine, "m-1", 11)
    assert poll(api, "m-1") == 204
    assert last_seen(owner_engine, "m-1") > first


def test_machines_list_each_agent_online_offline_or_never_seen(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    poll(api, "m-1")
    poll(api, "m-2")
    silent_for(owner_engine, "m-2", 300)
    command_id = send(runtime_engine, "m-3")  # a command, no agent yet
    poll(api, "m-9", org="org-other")  # another organization's machine

    listed = api.get("/machines", org=ORG, scopes=READER)

    assert listed.status_code == 200, listed.get_data(as_text=True)
    body = listed.get_json()
    assert [m["id"] for m in body["items"]] == ["m-1", "m-2", "m-3"] and body["next"] is None
    agents = {m["id"]: m["agent"] for m in body["items"]}
    assert agents["m-1"]["status"] == "online" and agents["m-1"]["secondsSinceSeen"] < 60
    assert agents["m-1"]["words"].startswith("agent last seen ")
    assert agents["m-2"]["status"] == "offline"
    assert agents["m-2"]["words"].startswith("offline: agent last seen 5 min")
    assert agents["m-3"] == {
        "status": "never seen",
        "lastSeenAt": None,
        "secondsSinceSeen": None,
        "words": "no agent seen yet",
    }
    m3 = api.get("/machines/m-3", org=ORG, scopes=["requests:read-all"]).get_json()
    assert m3["commandsUnderWay"] == 1 and m3["lastCommandAt"]
    commands = api.get("/machines/m-3/commands", org=ORG, scopes=READER).get_json()
    [command] = commands["items"]
    assert command["id"] == command_id and command["status"] == "pending"
    assert command["args"] == ["--now"] and command["deliverBy"] and command["outputBytes"] == 0


def test_machines_come_in_pages(api: Api) -> None:
    for machine in ("m-1", "m-2", "m-3"):
        poll(api, machine)

    first = api.get("/machines?limit=2", org=ORG, scopes=READER).get_json()
    rest = api.get(f"/machines?limit=2&after={first['next']}", org=ORG, scopes=READER)

    assert [m["id"] for m in first["items"]] == ["m-1", "m-2"] and first["next"] == "m-2"
    assert [m["id"] for m in rest.get_json()["items"]] == ["m-3"]
    assert rest.get_json()["next"] is None
    bad = api.get("/machines?limit=0", org=ORG, scopes=READER)
    assert bad.status_code == 400 and problem(bad)["code"] == "QUERY_INVALID"


def test_a_foreign_missing_or_unnameable_machine_is_the_same_404(api: Api) -> None:
    poll(api, "m-9", org="org-other")

    answers = [
        api.get(path, org=ORG, scopes=READER)
        for path in (
            "/machines/m-9",
            "/machines/m-404",
            "/machines/m-9/commands",
            "/machines/m%201",
        )
    ]

    assert {(a.status_code, a.get_data(as_text=True)) for a in answers} == {
        (answers[0].status_code, answers[0].get_data(as_text=True))
    }
    assert answers[0].status_code == 404
    refused = api.get("/machines", org=ORG, scopes=["requests:read"])
    assert refused.status_code == 403 and problem(refused)["code"] == "INSUFFICIENT_SCOPE"


def test_a_report_is_a_sign_of_life_too(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    command_id = send(runtime_engine, "m-1")
    assert poll(api, "m-1") == 200
    silent_for(owner_engine, "m-1", 120)  # a long command: no poll while it runs

    headers = api.headers(sub="machine:m-1", org=ORG, scopes=["agent"])
    reported = api.client().post(
        f"/api/v1/agent/commands/{command_id}/status",
        json={"status": "running"},
        headers=headers,
    )

    assert reported.status_code == 200
    machine = api.get("/machines/m-1", org=ORG, scopes=READER).get_json()
    assert machine["agent"]["status"] == "online"


def test_the_maintenance_leader_counts_offline_agents(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    for machine in ("m-1", "m-2", "m-3", "m-4"):
        poll(api, machine)
    silent_for(owner_engine, "m-2", 91)
    silent_for(owner_engine, "m-3", 3600)
    silent_for(owner_engine, "m-4", 8 * 86400)  # taken out of service: no longer counted
    reports: list[PassReport] = []
    loop = MaintenanceLoop(settings(), runtime_engine, "w-test", on_pass=reports.append)
    try:
        assert loop.run_once() is False
    finally:
        loop.lock.release()

    assert reports[0].agents_offline == 2
    assert AGENTS_OFFLINE._value.get() == 2
