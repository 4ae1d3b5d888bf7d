"""The quota rolloutItems: a constant list longer than the organization's is refused at
publishing, one from the request data when the step starts, in words, and nothing starts;
and a rollout starts no child while its organization is at its quota openExecutions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import ORG, OTHER_ORG, Api, problem, running_api
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    children,
    parent_flow,
    rollout_registry,
    start_rollout,
)
from tests.integration.worker_support import ORG as WORKER_ORG
from tests.integration.worker_support import audit, execution, run_once, settings

# One more than the quota's default.
TOO_MANY = [f"m-{n}" for n in range(10_001)]


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    registry = rollout_registry(database, PatchProvider())
    with running_api(database.runtime_dsn, registry=registry) as api:
        yield api


def test_publishing_refuses_a_constant_list_over_the_limit(api: Api) -> None:
    child = child_flow()
    api.publish(child)
    flow = parent_flow(child["key"])
    flow["transitions"][0]["actions"][0]["input"]["items"] = {"const": TOO_MANY}
    response = api.post("/flows", flow)
    assert response.status_code == 422, response.get_data(as_text=True)
    (found,) = [p for p in problem(response)["problems"] if p["path"].endswith("/input/items")]
    assert "the rollout has 10,001 items" in found["message"]
    assert "at most 10,000 (the organization's quota rolloutItems)" in found["message"]

    flow["transitions"][0]["actions"][0]["input"]["items"] = {"const": TOO_MANY[:-1]}
    assert api.post("/flows", flow).status_code == 201


def test_org_quotas_sets_one_organization_s_rollout_items(database: Any) -> None:
    registry = rollout_registry(database, PatchProvider())
    overrides = json.dumps({ORG: {"rolloutItems": 3}})
    with running_api(database.runtime_dsn, registry=registry, org_quotas=overrides) as api:
        child = child_flow()
        api.publish(child)
        api.publish(child, org=OTHER_ORG)
        flow = parent_flow(child["key"])
        flow["transitions"][0]["actions"][0]["input"]["items"] = {"const": ["a", "b", "c", "d"]}
        refused = api.post("/flows", flow)
        elsewhere = api.post("/flows", flow, org=OTHER_ORG)

    assert refused.status_code == 422
    (found,) = [p for p in problem(refused)["problems"] if p["path"].endswith("/input/items")]
    assert "at most 3 (the organization's quota rolloutItems)" in found["message"]
    assert elsewhere.status_code == 201, elsewhere.get_data(as_text=True)


def test_a_list_from_the_data_over_the_limit_fails_the_step_when_it_starts(
    database: Any, runtime_engine: Engine
) -> None:
    registry = rollout_registry(database, PatchProvider())
    executor = Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())
    parent = start_rollout(runtime_engine, TOO_MANY)
    assert run_once(runtime_engine, executor) == "FAILED"
    row = execution(runtime_engine, parent)
    assert row.error_code == "ROLLOUT_TOO_MANY_ITEMS"
    (exit_row,) = audit(runtime_engine, parent, "STEP_ERROR_EXIT")
    assert exit_row.detail["toState"] == "attention"
    assert children(runtime_engine, parent) == []


def test_a_list_over_the_organization_s_lower_quota_fails_the_step(
    database: Any, runtime_engine: Engine
) -> None:
    lower = {"org_quotas": json.dumps({WORKER_ORG: {"rolloutItems": 2}})}
    registry = rollout_registry(database, PatchProvider(), **lower)
    executor = Executor(
        registry, settings(database_url=database.runtime_dsn, **lower), WorkerHooks()
    )
    parent = start_rollout(runtime_engine, ["m-1", "m-2", "m-3"])
    assert run_once(runtime_engine, executor) == "FAILED"
    row = execution(runtime_engine, parent)
    assert row.error_code == "ROLLOUT_TOO_MANY_ITEMS"
    with runtime_engine.connect() as conn:
        said = conn.execute(
            text("SELECT string_agg(detail::text, ' ') FROM audit_event WHERE execution_id = :id"),
            {"id": parent},
        ).scalar_one()
    assert "at most 2 (the organization's quota rolloutItems)" in said
    assert children(runtime_engine, parent) == []


def test_a_rollout_starts_no_child_beyond_the_quota_open_executions(
    database: Any, runtime_engine: Engine
) -> None:
    # The parent's own execution is one of the two.
    limits = {"quota_open_executions": 2}
    registry = rollout_registry(database, PatchProvider(), **limits)
    executor = Executor(
        registry, settings(database_url=database.runtime_dsn, **limits), WorkerHooks()
    )
    parent = start_rollout(runtime_engine, ["m-1", "m-2", "m-3"], batch=3)
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, parent)) == 1
