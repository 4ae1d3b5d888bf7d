"""Then beside now on executions a real worker ran: the shapes the engine freezes into the
audit are the ones the view and the page read."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.machines import claim_next, delete_final_commands, report_status
from orquestador.worker.daemon import Worker
from tests.integration.api_support import Api, running_api
from tests.integration.worker_support import (
    ORG,
    OWNER,
    decommission,
    settings,
    start_execution,
    status_is,
    wait_until,
)


@pytest.fixture
def worker(database, runtime_engine: Engine) -> Iterator[Worker]:
    configured = settings(database_url=database.runtime_dsn)
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    running = Worker(configured, runtime_engine, registry)
    running.start()
    yield running
    running.stop(timeout=30)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _sent(engine: Engine) -> uuid.UUID:
    """The agent takes the command (it becomes `sent`) once the worker has written it."""

    def take():
        with engine.begin() as conn:
            return claim_next(conn, org_id=ORG, machine_id="m-1")

    return wait_until(take, what="the command to be written").id


def _report(engine: Engine, command_id: uuid.UUID, status: str) -> None:
    with engine.begin() as conn:
        report_status(
            conn, org_id=ORG, machine_id="m-1", command_id=command_id, status=status, exit_code=0
        )


def _page_words(api: Api, execution_id: uuid.UUID) -> str:
    client = api.client()
    token = api.token(sub=OWNER, org=ORG)
    signed = client.post("/ui/login", data={"token": token}, headers={"Origin": "http://localhost"})
    assert signed.status_code == 303
    page = client.get(f"/ui/executions/{execution_id}")
    assert page.status_code == 200
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.get_data(as_text=True)))


def _wait_step(api: Api, execution_id: uuid.UUID) -> dict:
    response = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG)
    assert response.status_code == 200, response.get_data(as_text=True)
    return next(s for s in response.get_json()["steps"] if s["actionId"] == "wait")


def test_a_deadline_run_out_shows_sent_then_timed_out_now_and_later_that_it_was_purged(
    worker: Worker, runtime_engine: Engine, api: Api
) -> None:
    execution_id = start_execution(runtime_engine, decommission(1), {"machineId": "m-1"})
    command_id = _sent(runtime_engine)
    wait_until(status_is(runtime_engine, execution_id, "FAILED"), what="the deadline to pass")

    # Before the agent says more, now is the same `sent`, read from the command's row.
    before = _wait_step(api, execution_id)
    assert (before["observed"]["status"], before["current"]["status"]) == ("sent", "sent")

    _report(runtime_engine, command_id, "timed_out")
    wait = _wait_step(api, execution_id)
    assert wait["observed"]["commandId"] == str(command_id)
    assert (wait["observed"]["status"], wait["current"]["status"]) == ("sent", "timed_out")
    words = _page_words(api, execution_id)
    assert re.search(r"Then, when the flow decided .* Status sent .* Now Status timed_out", words)
    assert "error exit chose the destination" in words

    with runtime_engine.begin() as conn:
        assert delete_final_commands(conn, 0, 100) == 1
    assert _wait_step(api, execution_id)["current"] == {"purged": True}
    words = _page_words(api, execution_id)
    assert "The command is no longer in the records." in words
    assert "timed_out" not in words


def test_a_command_that_succeeds_in_time_shows_the_rule_that_decided(
    worker: Worker, runtime_engine: Engine, api: Api
) -> None:
    execution_id = start_execution(runtime_engine, decommission(60), {"machineId": "m-1"})
    command_id = _sent(runtime_engine)
    # Reported once the wait has parked: a report that lands while the wait's round is
    # still running wakes nothing, and the round sleeps its own check_again_in first.
    wait_until(status_is(runtime_engine, execution_id, "WAITING"), what="the wait to park")
    _report(runtime_engine, command_id, "succeeded")
    wait_until(status_is(runtime_engine, execution_id, "SUCCEEDED"), what="the flow to end")

    response = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG).get_json()

    assert response["decision"] == {
        "by": "rules",
        "hitPolicy": "FIRST",
        "ruleIds": ["ok"],
        "toState": "done",
        "outcome": "DONE",
    }
    words = _page_words(api, execution_id)
    assert "Hit policy FIRST" in words and "Matched rules ok" in words
    assert "Destination done" in words and "Outcome DONE" in words
