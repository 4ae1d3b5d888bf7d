"""What a person reads of a run that continued: the view's links both ways, the timeline's
"continued from execution X, started by Y", and a dry run that follows its continuation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import Api, running_api
from sqlalchemy import Engine, text

from orquestador.api.tokens import mint_token
from orquestador.worker.daemon import Worker
from orquestador.worker.executor import Executor
from tests.integration.execution_page_support import HOST, text_of
from tests.integration.test_continuations import approve_then_reboot, doubles
from tests.integration.worker_support import (
    ORG,
    OWNER,
    registry_of,
    run_once,
    settings,
    start_execution,
    wait_until,
)

READER = ["requests:read", "requests:read-all", "flows:admin"]


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def get(api: Api, path: str) -> Any:
    token = mint_token(api.settings, sub=OWNER, org=ORG, scopes=READER)
    return api.client().get(f"/api/v1{path}", headers={"Authorization": f"Bearer {token}"})


def page(api: Api, path: str) -> str:
    client = api.client()
    token = mint_token(api.settings, sub=OWNER, org=ORG, scopes=READER)
    client.post("/ui/login", data={"token": token}, headers={"Origin": HOST})
    return text_of(client.get(path).get_data(as_text=True))


def test_a_continued_run_links_both_ways_and_says_who_started_it(
    api: Api, runtime_engine: Engine
) -> None:
    check, send = doubles()
    executor = Executor(registry_of(check, send), settings())
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})
    assert run_once(runtime_engine, executor) == "SUCCEEDED"

    before = get(api, f"/executions/{first}").get_json()
    second = before["continuedBy"]
    after = get(api, f"/executions/{second}").get_json()

    assert "continuedFrom" not in before
    assert (after["continuedFrom"], after["transitionId"], after["status"]) == (
        str(first),
        "reboot",
        "PENDING",
    )
    started = page(api, f"/ui/executions/{second}")
    assert f"Continued from execution {str(first)[:8]}, started by {OWNER}: reboot from ready" in (
        started
    )
    assert f"continued from execution {str(first)[:8]} (state ready), started by {OWNER}" in (
        started
    )
    finished = page(api, f"/ui/executions/{first}")
    assert f"State ready continues with reboot: execution {second[:8]}." in finished
    assert f"Continued as execution {second[:8]}" in finished


def test_a_run_parked_at_the_limit_says_why_and_what_a_person_can_do(
    api: Api, runtime_engine: Engine
) -> None:
    check, send = doubles()
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})
    assert run_once(
        runtime_engine, Executor(registry_of(check, send), settings(max_continuations=0))
    ) == ("SUCCEEDED")

    parked = get(api, f"/executions/{first}").get_json()["continuedBy"]
    view = get(api, f"/executions/{parked}").get_json()
    words = page(api, f"/ui/executions/{parked}")

    assert (view["status"], view["errorCode"]) == ("RECONCILIATION_REQUIRED", "CONTINUATION_LIMIT")
    assert "has continued 1 times in a row without a person (the limit is 0)" in words
    assert "Retry lets it run; fail leaves the request where it is." in words


def test_a_dry_run_follows_its_continuation_and_says_so(api: Api, runtime_engine: Engine) -> None:
    definition = approve_then_reboot()
    for transition in definition["transitions"]:
        transition["actions"] = []
    flow_id = api.publish(definition)["id"]
    worker = Worker(settings(database_url=api.settings.database_url), runtime_engine, registry_of())
    worker.start()
    try:
        started = api.post(f"/flows/{flow_id}/dry-runs", {"transition": "go", "data": {}})
        assert started.status_code == 202, started.get_data(as_text=True)
        first = started.get_json()["executionId"]

        def ended(execution_id: str) -> Any:
            view = api.get(f"/executions/{execution_id}?waitFor=final&timeout=5").get_json()
            return view if view["status"] in ("SUCCEEDED", "FAILED") else None

        view = wait_until(lambda: ended(first), what="the dry run ended")
        onward = wait_until(lambda: ended(view["continuedBy"]), what="its continuation ended")
    finally:
        worker.stop(timeout=30)

    assert view["wouldHaveDone"] == [
        {
            "actionId": None,
            "capability": None,
            "effect": None,
            "summary": "would continue from ready with reboot",
            "continuesAs": view["continuedBy"],
        }
    ]
    assert (onward["simulation"], onward["toState"]) == (True, "done")
    with runtime_engine.connect() as connection:
        simulated = connection.execute(
            text("SELECT bool_and(simulation) FROM execution WHERE id IN (:a, :b)"),
            {"a": uuid.UUID(first), "b": uuid.UUID(view["continuedBy"])},
        ).scalar_one()
    assert simulated is True
