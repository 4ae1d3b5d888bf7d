"""Accepting transitions: one transaction, one execution, conflicts answered 409."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from sqlalchemy import Engine, text

from orquestador.db.schema import EXECUTION_READY_CHANNEL


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, execution_max_attempts=4) as api:
        yield api


@pytest.fixture
def request_id(api: Api) -> str:
    return api.create_request(api.publish()["id"])["id"]


def _executions(engine: Engine, request_id: str) -> list:
    with engine.connect() as connection:
        return list(
            connection.execute(
                text("SELECT * FROM execution WHERE request_id = :id"), {"id": request_id}
            )
        )


def test_accepting_answers_202_with_the_execution_location(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    response = api.transition(request_id, "power-off", 1)

    assert response.status_code == 202
    execution_id = response.get_json()["executionId"]
    assert set(response.get_json()) == {"executionId"}
    assert response.headers["Location"] == f"/api/v1/executions/{execution_id}"

    with runtime_engine.connect() as connection:
        request_row = connection.execute(
            text("SELECT state, revision, busy_execution_id FROM request WHERE id = :id"),
            {"id": request_id},
        ).one()
        audit = connection.execute(
            text("SELECT * FROM audit_event WHERE execution_id = :id"), {"id": execution_id}
        ).one()
    assert request_row.state == "new"
    assert request_row.revision == 2
    assert str(request_row.busy_execution_id) == execution_id

    [execution] = _executions(runtime_engine, request_id)
    assert str(execution.id) == execution_id
    assert execution.status == "PENDING"
    assert execution.accepted_revision == 2
    assert execution.accepted_state == "new"
    assert execution.transition_id == "power-off"
    assert execution.org_id == "org-a"
    assert execution.max_attempts == 4
    assert execution.simulation is False
    assert execution.attempts == 0
    assert execution.actor_snapshot == {
        "sub": "alice",
        "org": "org-a",
        "scopes": ["flows:admin", "requests:read", "requests:write"],
    }

    assert audit.kind == "TRANSITION_ACCEPTED"
    assert (audit.org_id, str(audit.request_id), audit.actor) == ("org-a", request_id, "alice")
    assert audit.detail == {"transitionId": "power-off", "fromState": "new", "acceptedRevision": 2}


def test_the_execution_pins_the_requests_flow_version(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    pinned = api.get(f"/requests/{request_id}").get_json()["flowId"]
    api.publish()  # version 2 of the same key must not affect an existing request

    api.transition(request_id, "power-off", 1)

    [execution] = _executions(runtime_engine, request_id)
    assert str(execution.flow_id) == pinned


def test_a_dry_run_is_refused_until_dry_runs_exist_and_nothing_moves(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    body = {"transition": "power-off", "expectedRevision": 1, "simulation": True}

    response = api.post(f"/requests/{request_id}/transitions", body)

    assert response.status_code == 422
    refused = problem(response)
    assert refused["code"] == "SIMULATION_NOT_AVAILABLE"
    assert "/dry-runs" in refused["detail"]
    assert refused["problems"] == [
        {
            "path": "/simulation",
            "message": "dry runs start from the flow: POST /flows/{id}/dry-runs",
        }
    ]
    assert _executions(runtime_engine, request_id) == []
    after = api.get(f"/requests/{request_id}").get_json()
    assert (after["state"], after["revision"]) == ("new", 1)
    assert "executionId" not in after


def test_a_dry_run_of_a_missing_request_is_the_same_refusal(api: Api) -> None:
    body = {"transition": "power-off", "expectedRevision": 1, "simulation": True}

    response = api.post(f"/requests/{uuid.uuid4()}/transitions", body)

    assert (response.status_code, problem(response)["code"]) == (422, "SIMULATION_NOT_AVAILABLE")


def test_simulation_false_runs_the_transition_for_real(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    body = {"transition": "power-off", "expectedRevision": 1, "simulation": False}

    assert api.post(f"/requests/{request_id}/transitions", body).status_code == 202
    [execution] = _executions(runtime_engine, request_id)
    assert execution.simulation is False


def test_accepting_notifies_waiting_workers(api: Api, request_id: str, database) -> None:
    dsn = database.owner_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {EXECUTION_READY_CHANNEL}")

        assert api.transition(request_id, "power-off", 1).status_code == 202

        notices = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notices] == [EXECUTION_READY_CHANNEL]


def test_a_busy_request_answers_409(api: Api, request_id: str, runtime_engine: Engine) -> None:
    assert api.transition(request_id, "power-off", 1).status_code == 202

    response = api.transition(request_id, "power-off", 2)

    assert response.status_code == 409
    assert problem(response)["code"] == "REQUEST_BUSY"
    assert len(_executions(runtime_engine, request_id)) == 1


def test_a_stale_revision_answers_409_and_changes_nothing(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    response = api.transition(request_id, "power-off", 7)

    assert response.status_code == 409
    assert problem(response)["code"] == "REVISION_CONFLICT"
    assert _executions(runtime_engine, request_id) == []
    assert api.get(f"/requests/{request_id}").get_json()["revision"] == 1


def test_a_transition_that_does_not_leave_the_state_is_422(api: Api, request_id: str) -> None:
    response = api.transition(request_id, "retry", 1)

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "TRANSITION_NOT_ALLOWED"
    assert body["problems"][0]["path"] == "/transition"


def test_an_unknown_transition_is_422(api: Api, request_id: str) -> None:
    response = api.transition(request_id, "teleport", 1)

    assert response.status_code == 422
    assert problem(response)["code"] == "TRANSITION_UNKNOWN"


def test_an_invisible_request_is_404(api: Api, request_id: str) -> None:
    missing = api.transition(str(uuid.uuid4()), "power-off", 1)
    other_owner = api.transition(request_id, "power-off", 1, sub="bob")
    other_org = api.transition(request_id, "power-off", 1, org=OTHER_ORG)

    assert missing.status_code == 404
    assert other_owner.get_data() == other_org.get_data() == missing.get_data()


@pytest.mark.parametrize(
    "body",
    [
        {"transition": "power-off"},
        {"expectedRevision": 1},
        {"transition": "power-off", "expectedRevision": "1"},
        {"transition": "power-off", "expectedRevision": True},
        {"transition": "power-off", "expectedRevision": 1, "force": True},
    ],
)
def test_malformed_transition_bodies_are_422(api: Api, request_id: str, body: dict) -> None:
    response = api.post(f"/requests/{request_id}/transitions", body)

    assert response.status_code == 422
    assert problem(response)["code"] == "BODY_INVALID"


def test_concurrent_acceptances_let_exactly_one_through(
    api: Api, request_id: str, runtime_engine: Engine
) -> None:
    threads = 16
    barrier = threading.Barrier(threads)
    statuses: list[int] = []
    codes: list[str] = []
    headers = api.headers()
    body = {"transition": "power-off", "expectedRevision": 1}

    def accept() -> None:
        client = api.client()
        barrier.wait()
        response = client.post(
            f"/api/v1/requests/{request_id}/transitions", json=body, headers=headers
        )
        statuses.append(response.status_code)
        if response.status_code != 202:
            codes.append(response.get_json()["code"])

    workers = [threading.Thread(target=accept) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert sorted(statuses) == [202] + [409] * (threads - 1)
    assert set(codes) <= {"REVISION_CONFLICT", "REQUEST_BUSY"}
    assert len(_executions(runtime_engine, request_id)) == 1
    assert api.get(f"/requests/{request_id}").get_json()["revision"] == 2
