"""A command's output, live: taken once from the agent's chunks, kept within its bound,
read by offset, and shown by the wait box, the execution view, the pages and the CLI."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.machines import claim_next
from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, problem, running_api
from tests.integration.worker_support import (
    ORG,
    OWNER,
    decommission,
    execution,
    run_once,
    settings,
    start_execution,
)

READER = ["machines:admin"]


@pytest.fixture
def worker(database) -> Executor:
    configured = settings(database_url=database.runtime_dsn)
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    return Executor(registry, configured)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, command_output_max_bytes=4096) as api:
        yield api


def waiting_on_a_command(engine: Engine, worker: Executor) -> tuple[uuid.UUID, str]:
    execution_id = start_execution(engine, decommission(600), {"machineId": "m-1"})
    for _ in range(5):
        assert run_once(engine, worker) == "WAITING"
        key = execution(engine, execution_id).wait_key
        if key is not None:
            return execution_id, key.removeprefix("machine_command:")
    raise AssertionError("the execution never parked on its command")


def report(api: Api, command_id: str, status: str, **body: Any) -> dict[str, Any]:
    headers = api.headers(sub="machine:m-1", org=ORG, scopes=["agent"])
    answer = api.client().post(
        f"/api/v1/agent/commands/{command_id}/status",
        json={"status": status, **body},
        headers=headers,
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.get_json()


def output(api: Api, command_id: str, after: int = 0, **who: Any):
    who.setdefault("scopes", READER)
    who.setdefault("org", ORG)
    return api.get(f"/machines/m-1/commands/{command_id}/output?after={after}", **who)


@pytest.fixture
def running(worker: Executor, runtime_engine: Engine, api: Api) -> tuple[uuid.UUID, str]:
    execution_id, command_id = waiting_on_a_command(runtime_engine, worker)
    with runtime_engine.begin() as conn:
        assert claim_next(conn, org_id=ORG, machine_id="m-1") is not None
    return execution_id, command_id


def test_chunks_are_taken_once_and_read_after_an_offset(
    running: tuple[uuid.UUID, str], api: Api
) -> None:
    _, command_id = running
    first = report(api, command_id, "running", output="one\n", outputOffset=0)
    again = report(api, command_id, "running", output="one\n", outputOffset=0)
    report(api, command_id, "running", output="two\n", outputOffset=4)

    assert (first["outputOffset"], again["outputOffset"], again["changed"]) == (4, 4, False)
    whole = output(api, command_id).get_json()
    assert whole == {"output": "one\ntwo\n", "nextOffset": 8, "complete": False, "truncated": False}
    assert output(api, command_id, after=4).get_json()["output"] == "two\n"
    report(api, command_id, "succeeded", exitCode=0, output="three\n", outputOffset=8)
    end = output(api, command_id, after=8).get_json()
    assert end == {"output": "three\n", "nextOffset": 14, "complete": True, "truncated": False}


def test_a_long_output_keeps_its_head_and_its_end_within_the_bound(
    running: tuple[uuid.UUID, str], api: Api
) -> None:
    _, command_id = running
    offset = 0
    for number in range(120):  # 12 KB in chunks of 100 bytes, three times the bound
        line = f"line {number:04d} {'.' * 89}\n"
        answer = report(api, command_id, "running", output=line, outputOffset=offset)
        offset = answer["outputOffset"]

    assert answer["outputTruncated"] is True
    body = output(api, command_id).get_json()
    assert body["truncated"] is True
    assert body["output"].startswith("line 0000 ") and body["output"].endswith(
        f"line 0119 {'.' * 89}\n"
    )
    assert re.search(r"\[… \d+ bytes of output dropped …\]", body["output"])
    assert len(body["output"].encode()) < 4096 + 100


def test_only_readers_of_machines_read_output_and_a_stranger_gets_the_same_404(
    running: tuple[uuid.UUID, str], api: Api
) -> None:
    _, command_id = running
    report(api, command_id, "running", output="secret plans\n")

    assert output(api, command_id, scopes=["requests:read-all"]).status_code == 200
    refused = output(api, command_id, scopes=["requests:read"])
    assert refused.status_code == 403 and problem(refused)["code"] == "INSUFFICIENT_SCOPE"
    missing = [
        output(api, command_id, org="org-other"),
        output(api, str(uuid.uuid4())),
        output(api, "not-a-uuid"),
        api.get(f"/machines/m-2/commands/{command_id}/output", org=ORG, scopes=READER),
    ]
    bodies = {(r.status_code, r.get_data(as_text=True)) for r in missing}
    assert len(bodies) == 1 and next(iter(bodies))[0] == 404
    bad = output(api, command_id, after=-1)
    assert bad.status_code == 400 and problem(bad)["code"] == "QUERY_INVALID"


def test_the_wait_box_the_view_and_the_pages_show_the_last_200_lines(
    running: tuple[uuid.UUID, str], api: Api
) -> None:
    execution_id, command_id = running
    lines = "".join(f"step {n}\n" for n in range(300))
    report(api, command_id, "running", output=lines)

    view = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG).get_json()
    [wait] = [s for s in view["steps"] if s["actionId"] == "wait"]
    shown = wait["waitingFor"]["output"].splitlines()
    assert shown == [f"step {n}" for n in range(100, 300)]
    assert wait["waitingFor"]["outputBytes"] == len(lines)

    client = api.client()
    signed = client.post(
        "/ui/login",
        data={"token": api.token(sub=OWNER, org=ORG, scopes=["requests:read-all"])},
        headers={"Origin": "http://localhost"},
    )
    assert signed.status_code == 303
    page = client.get(f"/ui/executions/{execution_id}")
    assert page.headers["Refresh"]  # it follows the command while it runs
    html = page.get_data(as_text=True)
    assert "Output, last 200 lines so far" in html
    assert "step 299" in html and "step 99\n" not in html
    machine = client.get("/ui/machines/m-1")
    assert machine.headers["Refresh"]
    assert "step 299" in machine.get_data(as_text=True)

    report(api, command_id, "succeeded", exitCode=0)
    assert "Refresh" not in client.get("/ui/machines/m-1").headers


def test_the_page_never_shows_a_secret_the_output_carried(
    running: tuple[uuid.UUID, str], api: Api, runtime_engine: Engine, monkeypatch
) -> None:
    monkeypatch.setenv("BACKUP_PASSWORD", "correct-horse-battery")
    _, command_id = running

    report(api, command_id, "running", output="password: correct-horse-battery\n")

    with runtime_engine.connect() as conn:
        kept = conn.execute(
            text("SELECT output FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()
    assert kept == "password: [redacted]\n"


def test_a_stopped_agent_s_machine_shows_offline_in_the_wait_box_and_on_its_page(
    worker: Executor, runtime_engine: Engine, owner_engine: Engine, api: Api
) -> None:
    execution_id, _ = waiting_on_a_command(runtime_engine, worker)
    headers = api.headers(sub="machine:m-1", org=ORG, scopes=["agent"])
    taken = api.client().post("/api/v1/agent/commands/next?wait=0", headers=headers)
    assert taken.status_code == 200
    with owner_engine.begin() as conn:  # then the agent stopped: two hours of silence
        conn.execute(text("UPDATE machine_agent SET last_seen_at = now() - interval '2 h'"))

    view = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG).get_json()
    [wait] = [s for s in view["steps"] if s["actionId"] == "wait"]
    assert wait["waitingFor"]["agent"]["status"] == "offline"

    client = api.client()
    client.post(
        "/ui/login",
        data={"token": api.token(sub=OWNER, org=ORG, scopes=["requests:read-all"])},
        headers={"Origin": "http://localhost"},
    )
    for page in (f"/ui/executions/{execution_id}", "/ui/machines/m-1"):
        words = " ".join(re.sub(r"<[^>]+>", " ", client.get(page).get_data(as_text=True)).split())
        # In whole minutes: the seconds a busy machine takes between the two reads never
        # show (2 h, or 2 h 1 min).
        assert re.search(r"offline ?: agent last seen 2 h( \d+ min)? ago", words), page
