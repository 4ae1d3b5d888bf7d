"""Operators steer a rollout through the API: pause, resume, cancel, retry the failed
children; each audited, each within the scopes of cancel and reconcile."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import OTHER_ORG, Api, problem, running_api
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    children,
    parent_flow,
    rollout_registry,
    running_worker,
)
from tests.integration.worker_support import (
    audit,
    execution,
    run_once,
    settings,
    status_is,
    wait_until,
)

OPERATOR = ["executions:cancel", "requests:read"]
READER = ["requests:read"]


@pytest.fixture
def provider() -> PatchProvider:
    return PatchProvider(seconds=0.0)


@pytest.fixture
def api(database: Any, provider: PatchProvider) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=rollout_registry(database, provider)) as api:
        yield api


@pytest.fixture
def executor(database: Any, provider: PatchProvider) -> Executor:
    registry = rollout_registry(database, provider)
    return Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())


def start(api: Api, machines: list[str], **rollout: Any) -> uuid.UUID:
    """Alice publishes both flows and starts the rollout's `go`; its execution id."""
    child = child_flow()
    api.publish(child)
    parent = api.publish(parent_flow(child["key"], **rollout))
    created = api.create_request(parent["id"], {"machines": machines})
    response = api.transition(created["id"], "go", created["revision"])
    assert response.status_code == 202, response.get_data(as_text=True)
    return uuid.UUID(response.get_json()["executionId"])


def steer(api: Api, execution_id: uuid.UUID, what: str, scopes: list[str] = OPERATOR, **body: Any):
    return api.post(f"/executions/{execution_id}/rollout/{what}", body, sub="olga", scopes=scopes)


def test_a_paused_rollout_starts_no_child_until_it_resumes(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    parent = start(api, ["m-0", "m-1", "m-2"], batch=1)
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, parent)) == 1

    paused = steer(api, parent, "pause", reason="watching the graphs")
    assert paused.status_code == 200, paused.get_data(as_text=True)
    assert (paused.get_json()["paused"], paused.get_json()["pausedBy"]) == (True, "olga")
    assert run_once(runtime_engine, executor) == "SUCCEEDED"  # the first child
    assert run_once(runtime_engine, executor) == "WAITING"  # the parent, woken: paused
    assert len(children(runtime_engine, parent)) == 1

    resumed = steer(api, parent, "resume")
    assert resumed.status_code == 200 and resumed.get_json()["paused"] is False
    # The resume woke the parent: its round starts the next child at once.
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, parent)) == 2
    kinds = [row.kind for row in audit(runtime_engine, parent) if row.kind.startswith("ROLLOUT")]
    assert kinds == ["ROLLOUT_PAUSED", "ROLLOUT_RESUMED"]
    (pause_row,) = audit(runtime_engine, parent, "ROLLOUT_PAUSED")
    assert (pause_row.actor, pause_row.detail["reason"]) == ("olga", "watching the graphs")


def test_a_cancel_starts_no_new_child_and_cancels_the_running_ones(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    parent = start(api, ["m-0", "m-1", "m-2", "m-3"], batch=2)
    assert run_once(runtime_engine, executor) == "WAITING"
    pending = children(runtime_engine, parent)
    assert len(pending) == 2

    refused = steer(api, parent, "cancel")
    assert refused.status_code == 422  # a reason is required
    cancelled = steer(api, parent, "cancel", reason="bad patch")
    assert cancelled.status_code == 200, cancelled.get_data(as_text=True)
    answer = cancelled.get_json()
    assert answer["cancelRequested"] is True
    assert answer["cancelledChildren"] == {str(c.id): "CANCELLED" for c in pending}
    # Nothing was written by the children: released, counted cancelled.
    assert {c.execution_status for c in children(runtime_engine, parent)} == {"CANCELLED"}

    assert run_once(runtime_engine, executor) == "FAILED"
    row = execution(runtime_engine, parent)
    assert row.error_code == "ROLLOUT_CANCELLED"
    (exit_row,) = audit(runtime_engine, parent, "STEP_ERROR_EXIT")
    assert (
        exit_row.detail["observed"]["roll"]["cancelled"],
        exit_row.detail["observed"]["roll"]["skipped"],
    ) == (2, 2)
    assert len(children(runtime_engine, parent)) == 2

    again = steer(api, parent, "resume")
    assert again.status_code == 409 and problem(again)["code"] == "ROLLOUT_ENDED"


def test_retry_the_failed_starts_a_new_rollout_over_just_those(
    api: Api, database: Any, provider: PatchProvider, runtime_engine: Engine
) -> None:
    provider.failing = frozenset({"m-1", "m-3"})
    parent = start(api, ["m-0", "m-1", "m-2", "m-3"], batch=2, maxFailures=5)
    registry = rollout_registry(database, provider)
    with running_worker(database, registry):
        wait_until(status_is(runtime_engine, parent, "SUCCEEDED", "FAILED"), timeout=60)
        assert execution(runtime_engine, parent).status == "SUCCEEDED"

        not_allowed = steer(api, parent, "retry-failed")  # executions:cancel is not enough
        assert not_allowed.status_code == 403
        provider.failing = frozenset()
        retried = steer(api, parent, "retry-failed", scopes=["executions:reconcile"])
        assert retried.status_code == 202, retried.get_data(as_text=True)
        answer = retried.get_json()
        assert answer["items"] == 2 and answer["retryOf"]
        again = uuid.UUID(answer["executionId"])
        assert retried.headers["Location"].endswith(str(again))
        wait_until(status_is(runtime_engine, again, "SUCCEEDED", "FAILED"), timeout=60)

    assert execution(runtime_engine, again).status == "SUCCEEDED"
    assert [c.machine_id for c in children(runtime_engine, again)] == ["m-1", "m-3"]
    view = api.get(f"/executions/{again}/rollout", scopes=["requests:read-all"]).get_json()
    assert (view["retryOf"], view["total"], view["succeeded"]) == (answer["retryOf"], 2, 2)
    (audited,) = audit(runtime_engine, parent, "ROLLOUT_RETRIED")
    assert audited.detail["executionId"] == str(again)


def test_who_may_steer_a_rollout_and_what_it_says_otherwise(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    parent = start(api, ["m-0", "m-1"], batch=1)
    assert run_once(runtime_engine, executor) == "WAITING"
    reader = steer(api, parent, "pause", scopes=READER)
    assert reader.status_code == 403
    foreign = api.post(
        f"/executions/{parent}/rollout/pause", {}, sub="olga", org=OTHER_ORG, scopes=OPERATOR
    )
    assert foreign.status_code == 404
    # The request's owner may steer their own rollout with requests:write; another may not
    # even see it.
    own = steer(api, parent, "pause", scopes=["requests:write", "requests:read"])
    assert own.status_code == 404
    owner = api.post(
        f"/executions/{parent}/rollout/pause", {}, sub="alice", scopes=["requests:write"]
    )
    assert owner.status_code == 200, owner.get_data(as_text=True)
    retry_live = steer(api, parent, "retry-failed", scopes=["executions:reconcile"])
    assert retry_live.status_code == 409 and problem(retry_live)["code"] == "ROLLOUT_ENDED"

    view = api.get(f"/executions/{parent}/rollout", scopes=READER).get_json()
    assert view["children"][0]["status"] == "running"
    assert [c["status"] for c in view["children"][1:]] == ["waiting"]
    (child,) = children(runtime_engine, parent)
    assert api.get(f"/executions/{child.id}/rollout", scopes=READER).status_code == 404
