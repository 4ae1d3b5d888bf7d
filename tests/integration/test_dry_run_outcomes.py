"""Dry runs that rehearse every path: `outcomes` make steps answer a decision, an error,
a passed deadline or a given output, so error exits and rejections can be tried."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from orquestador.actions import AdapterRegistry
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, problem
from tests.integration.approval_support import (  # the fixtures api, executor, registry
    approval_flow,
    builtins_api,  # noqa: F401
    builtins_executor,  # noqa: F401
    builtins_registry,  # noqa: F401
)
from tests.integration.worker_support import (
    SimulatedCrash,
    crash_at_hook,
    execution,
    expire_lease,
    request_row,
    run_once,
    settings,
)


def _flow() -> dict[str, Any]:
    """The approval flow with a notice after the decision, to rehearse more than one step."""
    flow = approval_flow()
    flow["transitions"][0]["actions"].append(
        {
            "id": "tell",
            "capability": "notify",
            "version": 1,
            "input": {"title": {"const": "Reboot"}, "body": {"const": "decided"}},
            "onError": "timed-out",
        }
    )
    return flow


def _rehearse(api: Api, outcomes: dict[str, Any]) -> Any:
    flow_id = api.publish(_flow())["id"]
    body = {"data": {"machineId": "m-1"}, "transition": "ask", "outcomes": outcomes}
    return api.post(f"/flows/{flow_id}/dry-runs", body)


def _run(api: Api, runtime_engine: Engine, executor: Executor, outcomes: dict[str, Any]) -> Any:
    response = _rehearse(api, outcomes)
    assert response.status_code == 202, response.get_data(as_text=True)
    run_once(runtime_engine, executor)
    execution_id = uuid.UUID(response.get_json()["executionId"])
    view = api.get(f"/executions/{execution_id}").get_json()
    return execution(runtime_engine, execution_id), view


def test_a_rejection_is_rehearsed_without_asking_anybody(
    api: Api, runtime_engine: Engine, executor: Executor
) -> None:
    row, view = _run(api, runtime_engine, executor, {"ok": {"decision": "rejected"}})
    assert row.status == "SUCCEEDED"
    assert request_row(runtime_engine, row.request_id).state == "refused"
    said = {item["actionId"]: item["summary"] for item in view["wouldHaveDone"]}
    assert said["ok"] == "rehearsed: the decision rejected"
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM approval")).scalar_one() == 0


@pytest.mark.parametrize(
    ("outcome", "code"),
    [({"deadline": True}, "APPROVAL_DEADLINE_EXCEEDED"), ({"error": "PANEL_DOWN"}, "PANEL_DOWN")],
)
def test_a_deadline_or_an_error_takes_the_error_exit(
    api: Api, runtime_engine: Engine, executor: Executor, outcome: dict[str, Any], code: str
) -> None:
    row, view = _run(api, runtime_engine, executor, {"ok": outcome})
    assert (view["status"], view["toState"], view["errorCode"]) == ("FAILED", "timed-out", code)
    assert request_row(runtime_engine, row.request_id).state == "timed-out"


def test_a_given_output_is_checked_like_any_output(
    api: Api, runtime_engine: Engine, executor: Executor
) -> None:
    given = {"noticeId": str(uuid.uuid4()), "email": "off_on_node"}
    row, view = _run(api, runtime_engine, executor, {"tell": {"output": given}})
    # The approval itself was simulated (approved by dry-run), the notice rehearsed.
    assert row.status == "SUCCEEDED" and view["toState"] == "rebooting"
    _, broken = _run(api, runtime_engine, executor, {"tell": {"output": {"noticeId": 7}}})
    assert (broken["status"], broken["errorCode"]) == ("FAILED", "OUTPUT_INVALID")


@pytest.mark.parametrize(
    ("outcomes", "path"),
    [
        ({"nope": {"error": "X"}}, "/outcomes/nope"),
        ({"tell": {"deadline": True}}, "/outcomes/tell/deadline"),
        ({"tell": {"decision": "approved"}}, "/outcomes/tell/decision"),
    ],
)
def test_an_outcome_the_transition_cannot_give_is_refused(
    api: Api, runtime_engine: Engine, outcomes: dict[str, Any], path: str
) -> None:
    response = _rehearse(api, outcomes)
    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "OUTCOMES_INVALID"
    assert [p["path"] for p in body["problems"]] == [path]
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM execution")).scalar_one() == 0


@pytest.mark.parametrize(
    "outcome", [{}, {"error": "X", "deadline": True}, {"error": "not a code"}, {"decision": "yes"}]
)
def test_a_malformed_outcome_is_refused(api: Api, outcome: dict[str, Any]) -> None:
    response = _rehearse(api, {"ok": outcome})
    assert response.status_code == 422
    assert all(p["path"].startswith("/outcomes/ok") for p in problem(response)["problems"])


def test_a_real_execution_cannot_carry_outcomes(api: Api, owner_engine: Engine) -> None:
    response = _rehearse(api, {"ok": {"decision": "approved"}})
    execution_id = response.get_json()["executionId"]
    with pytest.raises(IntegrityError) as refused, owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET simulation = false WHERE id = :id"), {"id": execution_id}
        )
    assert "rehearsal_in_dry_runs_only" in str(refused.value)


def test_a_dry_run_cut_short_plays_its_outcomes_again_for_the_next_holder(
    api: Api, runtime_engine: Engine, registry: AdapterRegistry, database: Any
) -> None:
    """The holder dies right after the rehearsed step answered: the next holder reads the
    outcomes again (under its own fence) and ends where the first would have."""
    response = _rehearse(api, {"ok": {"decision": "rejected"}})
    execution_id = uuid.UUID(response.get_json()["executionId"])
    crashing = Executor(
        registry,
        settings(database_url=database.runtime_dsn),
        WorkerHooks(after_adapter=crash_at_hook),
    )
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    expire_lease(runtime_engine, execution_id)
    survivor = Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())
    assert run_once(runtime_engine, survivor, "w2") == "SUCCEEDED"
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).state == "refused"
