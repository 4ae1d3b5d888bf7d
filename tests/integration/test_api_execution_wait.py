"""Waiting for an execution to settle: `GET /executions/{id}?waitFor=final&timeout=S`."""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from sqlalchemy import Engine, text

from orquestador.api.execution_routes import WAIT_SHARE_EXTENSION
from orquestador.api.execution_waits import WaitShare
from tests.integration.execution_page_support import accepted


@pytest.fixture
def api(database) -> Iterator[Api]:
    # Four threads, half for agents: one place for a wait, beyond it 429.
    with running_api(database.runtime_dsn, api_threads=4) as api:
        yield api


def set_status(engine: Engine, execution_id: str, status: str, wait_key: str | None = None) -> None:
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = :status, wait_key = :key WHERE id = :id"),
            {"status": status, "key": wait_key, "id": execution_id},
        )


def wait(api: Api, execution_id: str, query: str = "waitFor=final&timeout=30", **who: Any) -> Any:
    return api.get(f"/executions/{execution_id}?{query}", **who)


def share(api: Api) -> WaitShare:
    return api.app.extensions[WAIT_SHARE_EXTENSION]


def test_a_wait_answers_as_soon_as_the_execution_ends(api: Api, owner_engine: Engine) -> None:
    _, _, execution_id = accepted(api)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait, api, execution_id)
        assert share(api).wait_until_held(1, timeout=30)
        set_status(owner_engine, execution_id, "SUCCEEDED")

        response = waiting.result(timeout=60)

    assert response.status_code == 200
    assert response.get_json()["status"] == "SUCCEEDED"
    assert share(api).held == 0


def waiting_on_approval(
    engine: Engine, execution_id: str, *, status: str = "open", deadline: str = "1 hour"
) -> str:
    """The execution WAITING on an approval of its own; the approval's id."""
    with engine.begin() as connection:
        approval_id = connection.execute(
            text(
                "INSERT INTO approval (org_id, request_id, execution_id, action_id, external_key,"
                " title, deadline_at, status, decided_at)"
                " SELECT org_id, request_id, id, 'ok', CAST(id AS text) || :suffix, 'Reboot?',"
                " now() + CAST(:deadline AS interval), :status,"
                " CASE WHEN :status = 'open' THEN NULL ELSE now() END"
                " FROM execution WHERE id = :id RETURNING id"
            ),
            {"id": execution_id, "status": status, "deadline": deadline, "suffix": ":ok"},
        ).scalar_one()
    set_status(engine, execution_id, "WAITING", f"approval:{approval_id}")
    return str(approval_id)


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED", "RECONCILIATION_REQUIRED"])
def test_a_settled_execution_is_answered_at_once_without_taking_a_place(
    api: Api, owner_engine: Engine, status: str
) -> None:
    _, _, execution_id = accepted(api)
    set_status(owner_engine, execution_id, status)
    share(api).limit = 0  # a wait that needed a place would be refused

    response = wait(api, execution_id)

    assert response.status_code == 200
    assert response.get_json()["status"] == status


def test_an_execution_waiting_on_an_open_approval_is_answered_at_once_and_names_it(
    api: Api, owner_engine: Engine
) -> None:
    _, _, execution_id = accepted(api)
    approval_id = waiting_on_approval(owner_engine, execution_id)
    share(api).limit = 0

    response = wait(api, execution_id)

    assert response.status_code == 200
    body = response.get_json()
    assert (body["status"], body["waitingForApproval"]) == ("WAITING", approval_id)


@pytest.mark.parametrize(
    ("status", "deadline"), [("approved", "1 hour"), ("open", "-1 second")], ids=["decided", "late"]
)
def test_an_approval_decided_or_past_its_deadline_is_waited_past(
    api: Api, owner_engine: Engine, status: str, deadline: str
) -> None:
    # Its execution moves on by itself: woken by the decision, or at the deadline.
    _, _, execution_id = accepted(api)
    waiting_on_approval(owner_engine, execution_id, status=status, deadline=deadline)
    share(api).limit = 0

    refused = wait(api, execution_id)

    assert refused.status_code == 429
    assert "waitingForApproval" not in api.get(f"/executions/{execution_id}").get_json()


def test_a_wait_on_a_machine_keeps_waiting_and_answers_the_view_at_its_timeout(
    api: Api, owner_engine: Engine
) -> None:
    _, _, execution_id = accepted(api)
    set_status(owner_engine, execution_id, "WAITING", "machine_command:1")

    response = wait(api, execution_id, "waitFor=final&timeout=0.2")

    assert response.status_code == 200
    body = response.get_json()
    assert body["status"] == "WAITING"
    assert "waitingForApproval" not in body


def test_waits_beyond_the_share_are_refused_with_retry_after(
    api: Api, owner_engine: Engine
) -> None:
    _, _, first = accepted(api)
    _, _, second = accepted(api)
    assert share(api).limit == 1
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holding = pool.submit(wait, api, first)
        assert share(api).wait_until_held(1, timeout=30)

        refused = wait(api, second)
        looked = wait(api, second, "waitFor=final&timeout=0")
        plain = api.get(f"/executions/{second}")
        set_status(owner_engine, first, "SUCCEEDED")
        assert holding.result(timeout=60).get_json()["status"] == "SUCCEEDED"

    assert refused.status_code == 429
    assert problem(refused)["code"] == "EXECUTION_WAITS_BUSY"
    assert refused.headers["Retry-After"] == "1"
    # A wait of 0 s and a plain read hold no thread: never refused for the share.
    assert looked.status_code == plain.status_code == 200


@pytest.mark.parametrize(
    ("query", "path"),
    [
        ("waitFor=end", "/waitFor"),
        ("waitFor=final&timeout=31", "/timeout"),
        ("waitFor=final&timeout=-1", "/timeout"),
        ("waitFor=final&timeout=nan", "/timeout"),
        ("waitFor=final&timeout=soon", "/timeout"),
        ("timeout=5", "/timeout"),
    ],
)
def test_a_wait_asked_wrongly_is_a_query_problem(api: Api, query: str, path: str) -> None:
    _, _, execution_id = accepted(api)

    response = wait(api, execution_id, query)

    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "QUERY_INVALID"
    assert [p["path"] for p in body["problems"]] == [path]


def test_waits_on_foreign_and_missing_executions_are_the_same_404(api: Api) -> None:
    _, _, execution_id = accepted(api)

    missing = wait(api, str(uuid.uuid4()))
    other_owner = wait(api, execution_id, sub="bob")
    other_org = wait(api, execution_id, org=OTHER_ORG)

    assert missing.status_code == 404
    for response in (other_owner, other_org):
        assert response.status_code == 404
        assert response.get_data() == missing.get_data()
    assert share(api).held == 0


@pytest.mark.parametrize(
    ("share_of", "agents", "threads", "places"),
    [
        (0.25, 0.5, 4, 1),
        (0.25, 0.5, 2, 0),
        (0.5, 0.5, 4, 1),
        (0.25, 1.0, 4, 0),
        (0.25, 0.5, 100, 25),
        (0.0, 0.5, 100, 0),
    ],
)
def test_waits_never_take_the_threads_agents_and_other_routes_need(
    share_of: float, agents: float, threads: int, places: int
) -> None:
    assert WaitShare.limit_for(share_of, agents, threads) == places
