"""Dry runs rehearse a rollout: nothing real starts, the dry run says what it would have
started, and `outcomes` per item index play the failure budget as a real run would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.integration.api_support import Api, problem, running_api
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    parent_flow,
    rollout_registry,
)
from tests.integration.worker_support import dry_run_with_worker

MACHINES = ["m-0", "m-1", "m-2", "m-3", "m-4", "m-5"]


@pytest.fixture
def provider() -> PatchProvider:
    return PatchProvider(seconds=0.0)


@pytest.fixture
def api(database: Any, provider: PatchProvider) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=rollout_registry(database, provider)) as api:
        yield api


def _published(api: Api) -> str:
    child = child_flow()
    api.publish(child)
    return api.publish(parent_flow(child["key"], batch=2, maxFailures=1))["id"]


def _real_executions(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM execution WHERE NOT simulation")).scalar()


def test_a_dry_run_says_what_the_rollout_would_start_and_starts_nothing(
    api: Api, database: Any, provider: PatchProvider, runtime_engine: Engine
) -> None:
    flow_id = _published(api)
    registry = rollout_registry(database, provider)
    body = {"transition": "go", "data": {"machines": MACHINES}}
    view = dry_run_with_worker(api, runtime_engine, registry, flow_id, body)

    assert view["status"] == "SUCCEEDED", (view.get("errorCode"), view["steps"])
    (would,) = view["wouldHaveDone"]
    assert would["summary"].startswith("would start 6 of 6 child requests of ")
    assert "2 at a time, stopping once failures exceed 1" in would["summary"]
    assert provider.ledger == [] and _real_executions(runtime_engine) == 0
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM rollout")).scalar() == 0


def test_outcomes_per_item_index_rehearse_the_failure_budget(
    api: Api, database: Any, provider: PatchProvider, runtime_engine: Engine
) -> None:
    flow_id = _published(api)
    registry = rollout_registry(database, provider)
    # Items 1 and 2 fail: the budget (1) is spent once item 2 has ended, so with a batch of
    # 2, item 3 was already running and the rest are skipped.
    body = {
        "transition": "go",
        "data": {"machines": MACHINES},
        "outcomes": {"roll": {"children": {"1": "failed", "2": "failed"}}},
    }
    view = dry_run_with_worker(api, runtime_engine, registry, flow_id, body)

    assert (view["status"], view["errorCode"], view["toState"]) == (
        "FAILED",
        "ROLLOUT_FAILURE_BUDGET",
        "attention",
    )
    seen = view["steps"][0]["observed"]
    assert (seen["succeeded"], seen["failed"], seen["skipped"]) == (2, 2, 2)
    assert seen["summary"].startswith("would start 4 of 6 child requests")
    assert provider.ledger == [] and _real_executions(runtime_engine) == 0

    refused = api.post(
        f"/flows/{flow_id}/dry-runs",
        {
            "transition": "go",
            "data": {"machines": MACHINES},
            "outcomes": {"roll": {"children": {"one": "failed"}}},
        },
    )
    assert refused.status_code == 422 and problem(refused)["code"]
