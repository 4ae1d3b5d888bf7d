"""A worker killed with SIGKILL during a read: the read wrote no checkpoint before its call
(SPEC 28), yet the next holder runs it again under the same external key, and the
execution page and the API still show every attempt, the interrupted one included."""

from __future__ import annotations

import re
import signal
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from tests.acceptance.crash_support import read_ledger, spawn_worker
from tests.integration.api_support import Api, running_api
from tests.integration.worker_support import (
    ORG,
    OWNER,
    accept_transition,
    action,
    audit,
    checkpoints,
    create_request,
    execution,
    flow_definition,
    publish_flow,
    status_is,
    wait_until,
)

ADAPTERS = "tests.acceptance.read_crash_adapters"
LEASE = {"lease_seconds": 10, "renew_seconds": 1}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _page_words(api: Api, execution_id: object) -> str:
    client = api.client()
    token = api.token(sub=OWNER, org=ORG)
    signed = client.post("/ui/login", data={"token": token}, headers={"Origin": "http://localhost"})
    assert signed.status_code == 303
    page = client.get(f"/ui/executions/{execution_id}")
    assert page.status_code == 200
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.get_data(as_text=True)))


def test_a_read_killed_mid_call_runs_again_under_its_key_and_every_attempt_shows(
    database, runtime_engine, processes, tmp_path, api: Api
):
    ledger = tmp_path / "ledger.jsonl"
    flow = publish_flow(
        runtime_engine,
        flow_definition([action("look", "crash.look"), action("peek", "crash.peek")]),
    )
    eid = accept_transition(runtime_engine, create_request(runtime_engine, flow))
    victim = spawn_worker(database, ADAPTERS, ledger, "victim", concurrency=1, **LEASE)
    processes.append(victim)
    wait_until(
        lambda: any(
            e["role"] == "victim" and e["capability"] == "crash.look" for e in read_ledger(ledger)
        ),
        timeout=60,
        what="the victim in the read's call",
    )
    # The read wrote nothing before its call (a later step would: nothing may ride past
    # a step that writes nothing).
    with runtime_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM action_execution WHERE execution_id = :id"),
                {"id": eid},
            ).scalar_one()
            == 0
        )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    survivor = spawn_worker(database, ADAPTERS, ledger, "survivor", concurrency=1, **LEASE)
    processes.append(survivor)
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), timeout=60, what="the recovery")

    entries = read_ledger(ledger)
    starts = Counter((e["key"], e["role"]) for e in entries if e["event"] == "start")
    # The same external key on both holders: derived from the execution and the action.
    assert starts == {
        (f"{eid}:look", "victim"): 1,
        (f"{eid}:look", "survivor"): 1,
        (f"{eid}:peek", "survivor"): 1,
    }
    assert execution(runtime_engine, eid).attempts == 2
    (interrupted,) = audit(runtime_engine, eid, "ATTEMPT_INTERRUPTED")
    assert interrupted.detail["attempt"] == 1
    steps = checkpoints(runtime_engine, eid)
    assert {(a, row.status, row.external_key) for a, row in steps.items()} == {
        ("peek", "SUCCEEDED", f"{eid}:peek"),
        ("look", "SUCCEEDED", f"{eid}:look"),
    }

    view = api.get(f"/executions/{eid}", sub=OWNER, org=ORG).get_json()
    assert view["attempts"] == 2
    assert [(i["attempt"], i["why"]) for i in view["interruptedAttempts"]] == [
        (1, "WORKER_STOPPED")
    ]
    # The holder that took over recalled the first step without a success as the one
    # interrupted: attempt 1 of `look` is in its history, and the survivor's is attempt 2.
    assert {
        step["actionId"]: [
            (a["attempt"], a["status"], a.get("errorCode")) for a in step["attempts"]
        ]
        for step in view["steps"]
    } == {
        "look": [(1, "FAILED", "INTERRUPTED"), (2, "SUCCEEDED", None)],
        "peek": [(1, "SUCCEEDED", None)],
    }
    words = _page_words(api, eid)
    assert "Attempt 1 was interrupted: its worker stopped" in words

    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(30) == 0
