"""A rollout on its execution's page: counts, the budget used, the children by status with
links, pause, resume, cancel and retry with CSRF; the list filtered by parent; a child's page
links its parent."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine

from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, running_api
from tests.integration.execution_page_support import HOST, signed_in, text_of
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    children,
    parent_flow,
    rollout_registry,
)
from tests.integration.worker_support import audit, execution, run_once, settings

OPERATOR = ["requests:read-all", "executions:cancel", "executions:reconcile"]


@pytest.fixture
def provider() -> PatchProvider:
    return PatchProvider(seconds=0.0, failing=frozenset({"m-1"}))


@pytest.fixture
def api(database: Any, provider: PatchProvider) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=rollout_registry(database, provider)) as api:
        yield api


@pytest.fixture
def executor(database: Any, provider: PatchProvider) -> Executor:
    registry = rollout_registry(database, provider)
    return Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())


def start(api: Api, machines: list[str], **rollout: Any) -> str:
    child = child_flow()
    api.publish(child)
    parent = api.publish(parent_flow(child["key"], **rollout))
    created = api.create_request(parent["id"], {"machines": machines})
    response = api.transition(created["id"], "go", created["revision"])
    assert response.status_code == 202, response.get_data(as_text=True)
    return response.get_json()["executionId"]


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def steer(client: FlaskClient, execution_id: str, what: str, **form: str) -> Any:
    page = client.get(f"/ui/executions/{execution_id}").get_data(as_text=True)
    data = {"csrf": csrf_of(page), **form}
    origin = data.pop("origin", HOST)
    return client.post(
        f"/ui/executions/{execution_id}/rollout/{what}", data=data, headers={"Origin": origin}
    )


def test_the_page_shows_counts_budget_and_children_and_pauses_and_resumes(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    parent = start(api, ["m-0", "m-1", "m-2", "m-3"], batch=2, maxFailures=2)
    assert run_once(runtime_engine, executor) == "WAITING"  # m-0 and m-1 started
    assert run_once(runtime_engine, executor) in ("SUCCEEDED", "FAILED")
    assert run_once(runtime_engine, executor) in ("SUCCEEDED", "FAILED")
    client = signed_in(api, scopes=OPERATOR)
    html = client.get(f"/ui/executions/{parent}").get_data(as_text=True)
    words = text_of(html)
    assert "Failures 1 of 2 allowed." in words
    assert "1 succeeded, 1 failed, 0 cancelled, 0 running, 0 skipped, of 4 items" in words
    started = children(runtime_engine, uuid.UUID(parent))
    for child in started:
        assert f'href="/ui/executions/{child.id}"' in html
    assert f"/ui/executions?parentExecutionId={parent}" in html

    forged = steer(client, parent, "pause", origin="https://evil.example")
    assert forged.status_code == 403
    assert audit(runtime_engine, uuid.UUID(parent), "ROLLOUT_PAUSED") == []

    paused = steer(client, parent, "pause")
    assert paused.status_code == 303
    assert paused.headers["Location"] == f"/ui/executions/{parent}?done=rollout-pause"
    after = text_of(client.get(paused.headers["Location"]).get_data(as_text=True))
    assert "The rollout is paused: no child starts until it resumes." in after
    assert "paused by alice" in after and "Resume the rollout" in after
    assert run_once(runtime_engine, executor) == "WAITING"  # woken, but paused
    assert len(children(runtime_engine, uuid.UUID(parent))) == 2

    assert steer(client, parent, "resume").status_code == 303
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, uuid.UUID(parent))) == 4

    listed = client.get(f"/ui/executions?parentExecutionId={parent}").get_data(as_text=True)
    for child in children(runtime_engine, uuid.UUID(parent)):
        assert str(child.id) in listed
    assert f'href="/ui/executions/{parent}"' not in listed  # the children only

    child_page = client.get(f"/ui/executions/{started[0].id}").get_data(as_text=True)
    assert f'href="/ui/executions/{parent}"' in child_page
    assert "the rollout of execution" in text_of(child_page)


def test_cancel_needs_a_reason_and_retry_the_failed_starts_a_new_rollout_from_the_page(
    api: Api, executor: Executor, runtime_engine: Engine, provider: PatchProvider
) -> None:
    parent = start(api, ["m-0", "m-1", "m-2"], batch=3, maxFailures=1)
    assert run_once(runtime_engine, executor) == "WAITING"
    client = signed_in(api, scopes=OPERATOR)
    no_reason = steer(client, parent, "cancel")
    assert no_reason.status_code == 422
    assert audit(runtime_engine, uuid.UUID(parent), "ROLLOUT_CANCELLED") == []
    for _ in range(3):
        run_once(runtime_engine, executor)  # the three children
    assert run_once(runtime_engine, executor) == "SUCCEEDED"  # one failure: within budget

    provider.failing = frozenset()
    page = client.get(f"/ui/executions/{parent}").get_data(as_text=True)
    assert "Retry the 1 failed children" in text_of(page)
    assert "Pause the rollout" not in page  # ended: nothing to steer
    retried = steer(client, parent, "retry-failed")
    assert retried.status_code == 303
    again = retried.headers["Location"].split("?")[0].rsplit("/", 1)[-1]
    assert retried.headers["Location"].endswith("?done=rollout-retry-failed")
    assert execution(runtime_engine, uuid.UUID(again)).status == "PENDING"
    assert run_once(runtime_engine, executor) == "WAITING"
    assert [c.machine_id for c in children(runtime_engine, uuid.UUID(again))] == ["m-1"]
    words = text_of(client.get(f"/ui/executions/{again}").get_data(as_text=True))
    assert "It retries the failed children of rollout" in words


def test_the_executions_list_takes_a_parent_and_offers_no_bulk_over_it(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    parent = start(api, ["m-0", "m-2"], batch=2)
    assert run_once(runtime_engine, executor) == "WAITING"
    response = api.get(f"/executions?parentExecutionId={parent}", scopes=["requests:read-all"])
    assert response.status_code == 200, response.get_data(as_text=True)
    items = response.get_json()["items"]
    assert sorted(i["id"] for i in items) == sorted(
        str(c.id) for c in children(runtime_engine, uuid.UUID(parent))
    )
    assert {i["parentExecutionId"] for i in items} == {parent}
    bad = api.get("/executions?parentExecutionId=nope", scopes=["requests:read-all"])
    assert bad.status_code == 400
    client = signed_in(api, scopes=OPERATOR)
    listed = client.get(f"/ui/executions?parentExecutionId={parent}").get_data(as_text=True)
    assert "/ui/bulk" not in listed
