"""The ExecutionView: exactly the safe fields, seen only by who may see the request."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from api_support import OTHER_ORG, Api, running_api
from sqlalchemy import Engine, text

from orquestador.actions import TransientError
from orquestador.worker.executor import Executor
from tests.integration import worker_support

BASE_KEYS = {
    "id",
    "requestId",
    "flowId",
    "transitionId",
    "status",
    "attempts",
    "priority",
    "steps",
    "createdAt",
    "updatedAt",
    # What a person reads it by: the flow, and the machine the request's data names.
    "flowKey",
    "flowVersion",
    "machineId",
}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def accepted(api: Api) -> dict[str, str]:
    flow_id = api.publish()["id"]
    request_id = api.create_request(flow_id)["id"]
    execution_id = api.transition(request_id, "power-off", 1).get_json()["executionId"]
    return {"flowId": flow_id, "requestId": request_id, "executionId": execution_id}


def _finish(engine: Engine, execution_id: str) -> None:
    """What a worker leaves behind: checkpoints with secrets in them, a result, a lease token."""
    with engine.begin() as connection:
        for action_id, status, started in (
            ("send", "SUCCEEDED", "00:00:01"),
            ("wait", "FAILED", "00:00:02"),
        ):
            connection.execute(
                text(
                    "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                    " fencing_token, input_hash, external_key, effect, capability,"
                    " adapter_version, output, error_code, started_at, finished_at)"
                    " VALUES (:id, :action, :status, 1, 7, 'hash', :key, 'NON_IDEMPOTENT_WRITE',"
                    " 'machine.command', 1, '{\"secret\": \"provider-raw\"}', NULL,"
                    " timestamptz '2030-01-01 00:00:00+00' + CAST(:started AS interval),"
                    " timestamptz '2030-01-01 00:00:00+00' + CAST(:started AS interval)"
                    " + interval '1 second')"
                ),
                {
                    "id": execution_id,
                    "action": action_id,
                    "status": status,
                    "key": f"{execution_id}:{action_id}",
                    "started": started,
                },
            )
        connection.execute(
            text(
                "UPDATE execution SET status = 'SUCCEEDED', attempts = 1, fencing_token = 7,"
                ' result = \'{"outcome": "DONE", "toState": "off", "raw": "secret"}\','
                " error_code = 'STEP_FAILED', finished_at = now() WHERE id = :id"
            ),
            {"id": execution_id},
        )


def test_a_pending_execution_has_exactly_the_base_fields(
    api: Api, accepted: dict[str, str]
) -> None:
    response = api.get(f"/executions/{accepted['executionId']}")

    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == BASE_KEYS
    assert body["id"] == accepted["executionId"]
    assert body["requestId"] == accepted["requestId"]
    assert body["flowId"] == accepted["flowId"]
    assert body["transitionId"] == "power-off"
    assert body["status"] == "PENDING"
    assert body["attempts"] == 0
    assert body["steps"] == []
    for name in ("createdAt", "updatedAt"):
        assert body[name].endswith("Z")
        datetime.fromisoformat(body[name])


def test_a_finished_execution_shows_outcome_steps_and_error_code_only(
    api: Api, accepted: dict[str, str], owner_engine: Engine
) -> None:
    _finish(owner_engine, accepted["executionId"])

    body = api.get(f"/executions/{accepted['executionId']}").get_json()

    assert set(body) == BASE_KEYS | {"outcome", "toState", "errorCode"}
    assert (body["status"], body["outcome"], body["toState"]) == ("SUCCEEDED", "DONE", "off")
    assert body["errorCode"] == "STEP_FAILED"
    assert body["attempts"] == 1
    assert body["steps"] == [
        {
            "actionId": "send",
            "status": "SUCCEEDED",
            "startedAt": "2030-01-01T00:00:01Z",
            "finishedAt": "2030-01-01T00:00:02Z",
            "attempts": [],
        },
        {
            "actionId": "wait",
            "status": "FAILED",
            "startedAt": "2030-01-01T00:00:02Z",
            "finishedAt": "2030-01-01T00:00:03Z",
            "attempts": [],
        },
    ]
    text_body = api.get(f"/executions/{accepted['executionId']}").get_data(as_text=True)
    for secret in ("provider-raw", "secret", "hash", "alice", "scopes", "fencing"):
        assert secret not in text_body


def test_foreign_and_missing_executions_are_byte_identical_404s(
    api: Api, accepted: dict[str, str]
) -> None:
    path = f"/executions/{accepted['executionId']}"

    missing = api.get(f"/executions/{uuid.uuid4()}")
    other_owner = api.get(path, sub="bob")
    other_org = api.get(path, org=OTHER_ORG)
    other_org_read_all = api.get(path, org=OTHER_ORG, scopes=["requests:read-all"])
    malformed = api.get("/executions/12345")

    assert missing.status_code == 404
    for response in (other_owner, other_org, other_org_read_all, malformed):
        assert response.status_code == 404
        assert response.get_data() == missing.get_data()


def test_read_all_sees_executions_of_other_owners_in_the_organization(
    api: Api, accepted: dict[str, str]
) -> None:
    response = api.get(
        f"/executions/{accepted['executionId']}", sub="auditor", scopes=["requests:read-all"]
    )

    assert response.status_code == 200
    assert response.get_json()["id"] == accepted["executionId"]


def _worker_caller() -> dict[str, str]:
    return {"org": worker_support.ORG, "sub": worker_support.OWNER}


def test_a_retrying_execution_shows_each_attempt_and_when_it_runs_again(
    api: Api, runtime_engine: Engine
) -> None:
    def busy(ctx: Any) -> dict[str, Any]:
        raise TransientError("provider busy, try later")

    write = worker_support.RecordingAdapter("test.write", max_attempts=3, output=busy)
    eid = worker_support.start_execution(
        runtime_engine, worker_support.flow_definition([worker_support.action("w", "test.write")])
    )
    executor = Executor(worker_support.registry_of(write), worker_support.settings())
    assert worker_support.run_once(runtime_engine, executor) == "RETRY_WAIT"

    body = api.get(f"/executions/{eid}", **_worker_caller()).get_json()

    assert body["status"] == "RETRY_WAIT" and body["errorCode"] == "TRANSIENT"
    (step,) = body["steps"]
    assert (step["status"], step["errorCode"]) == ("FAILED", "TRANSIENT")
    assert step["nextAttemptAt"] == body["nextAttemptAt"]
    assert body["nextAttemptAt"] > step["finishedAt"]
    (attempt,) = step["attempts"]
    assert (attempt["attempt"], attempt["status"], attempt["errorCode"], attempt["message"]) == (
        1,
        "FAILED",
        "TRANSIENT",
        "provider busy, try later",
    )
    assert attempt["finishedAt"] == step["finishedAt"]


def test_a_mapping_failure_names_the_action_field_and_pointer(
    api: Api, runtime_engine: Engine
) -> None:
    write = worker_support.RecordingAdapter("test.write")
    definition = worker_support.flow_definition(
        [worker_support.action("w", "test.write", input={"machine": {"from": "/data/machineId"}})]
    )
    eid = worker_support.start_execution(runtime_engine, definition)
    executor = Executor(worker_support.registry_of(write), worker_support.settings())
    assert worker_support.run_once(runtime_engine, executor) == "FAILED"

    body = api.get(f"/executions/{eid}", **_worker_caller()).get_json()

    assert body["errorCode"] == "MAPPING_FAILED"
    assert body["errorDetail"] == {
        "actionId": "w",
        "field": "machine",
        "pointer": "/data/machineId",
    }
    assert body["steps"] == []
