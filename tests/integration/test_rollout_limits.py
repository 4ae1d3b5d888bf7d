"""ROLLOUT_MAX_ITEMS: a constant list longer than that is refused at publishing, one from
the request data when the step starts, in words, and nothing starts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.domain.rollouts import ROLLOUT_MAX_ITEMS
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, problem, running_api
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    children,
    parent_flow,
    rollout_registry,
    start_rollout,
)
from tests.integration.worker_support import audit, execution, run_once, settings

TOO_MANY = [f"m-{n}" for n in range(ROLLOUT_MAX_ITEMS + 1)]


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
    assert "at most 10,000 (ROLLOUT_MAX_ITEMS)" in found["message"]

    flow["transitions"][0]["actions"][0]["input"]["items"] = {"const": TOO_MANY[:-1]}
    assert api.post("/flows", flow).status_code == 201


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
