"""Cancel reaches the machine: commands nobody took end with the cancel, taken ones are told."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.machines import claim_next, report_status
from orquestador.queue.bulk import BulkWalk, act_on_chunk
from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, running_api
from tests.integration.worker_support import (
    ORG,
    OWNER,
    action,
    audit,
    decommission,
    execution,
    request_row,
    run_once,
    settings,
    start_execution,
)


@pytest.fixture
def worker(database) -> Executor:
    # Rounds run only when a test says so: no worker takes the execution back between a
    # command's status change and the cancel, which would find it RUNNING.
    configured = settings(database_url=database.runtime_dsn)
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    return Executor(registry, configured)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def waiting_on_a_command(engine: Engine, worker: Executor) -> tuple[uuid.UUID, uuid.UUID]:
    """An execution parked on its machine.wait, and the command it sent (still pending)."""
    execution_id = start_execution(engine, decommission(600), {"machineId": "m-1"})
    for _ in range(5):  # an earlier execution whose recheck fell due may be taken first
        assert run_once(engine, worker) == "WAITING"
        key = execution(engine, execution_id).wait_key
        if key is not None:
            return execution_id, uuid.UUID(key.removeprefix("machine_command:"))
    raise AssertionError("the execution never parked on its command")


def command_row(engine: Engine, command_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, finished_at, cancel_requested_at FROM machine_command"
                " WHERE id = :id"
            ),
            {"id": command_id},
        ).one()


def take(engine: Engine) -> Any:
    with engine.begin() as conn:
        return claim_next(conn, org_id=ORG, machine_id="m-1")


def cancel(api: Api, execution_id: uuid.UUID) -> dict[str, Any]:
    response = api.post(
        f"/executions/{execution_id}/cancel",
        {"reason": "the customer stayed"},
        org=ORG,
        scopes=["executions:cancel"],
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def said(command_id: uuid.UUID) -> dict[str, str]:
    return {"id": str(command_id), "machineId": "m-1", "command": "poweroff"}


def test_a_pending_command_is_cancelled_with_the_execution_and_never_handed_out(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    execution_id, command_id = waiting_on_a_command(runtime_engine, worker)
    assert command_row(runtime_engine, command_id).status == "pending"

    answer = cancel(api, execution_id)

    # machine.command's only effect was a command no agent took, withdrawn by the cancel
    # itself: nothing happened, so nothing is left for a person to decide (SPEC 23).
    assert answer["status"] == "CANCELLED"
    assert answer["machineCommands"] == {"cancelled": [said(command_id)], "stopRequested": []}
    row = command_row(runtime_engine, command_id)
    assert (row.status, row.cancel_requested_at) == ("cancelled", None)
    assert row.finished_at is not None
    assert take(runtime_engine) is None  # the agent's next poll gets nothing
    (ended,) = audit(runtime_engine, execution_id, "EXECUTION_CANCELLED")
    assert ended.detail["machineCommands"] == answer["machineCommands"]
    assert audit(runtime_engine, execution_id, "RECONCILIATION_REQUIRED") == []
    # The request is free again, in its state, with its data.
    request = request_row(runtime_engine, execution(runtime_engine, execution_id).request_id)
    assert (request.state, request.busy_execution_id) == ("new", None)
    assert request.data == {"machineId": "m-1"}


def test_a_command_an_agent_took_parks_the_cancel_even_once_it_ended(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    # Taken, then stopped on the machine (or refused as late): final, but an agent had it,
    # and it may have done part of its work. That is a write a person must look at.
    execution_id, command_id = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == command_id
    with runtime_engine.begin() as conn:
        report_status(conn, org_id=ORG, machine_id="m-1", command_id=command_id, status="cancelled")

    answer = cancel(api, execution_id)

    assert answer["status"] == "RECONCILIATION_REQUIRED"
    request = request_row(runtime_engine, execution(runtime_engine, execution_id).request_id)
    assert request.busy_execution_id == execution_id


def test_another_execution_s_withdrawn_command_does_not_undo_this_one_s_write(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    # Same flow, same step names: only this execution's own command counts.
    taken, taken_command = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == taken_command
    withdrawn, _ = waiting_on_a_command(runtime_engine, worker)
    assert cancel(api, withdrawn)["status"] == "CANCELLED"

    assert cancel(api, taken)["status"] == "RECONCILIATION_REQUIRED"


def test_a_write_besides_the_withdrawn_command_still_parks_the_cancel(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    noted = decommission(600)
    noted["transitions"][0]["actions"].insert(
        0,
        action(
            "note",
            "notify",
            input={"title": {"const": "Powering off"}, "body": {"from": "/data/machineId"}},
        ),
    )
    execution_id = start_execution(runtime_engine, noted, {"machineId": "m-1"})
    for _ in range(5):
        if (
            run_once(runtime_engine, worker) == "WAITING"
            and execution(runtime_engine, execution_id).wait_key
        ):
            break

    answer = cancel(api, execution_id)

    assert answer["status"] == "RECONCILIATION_REQUIRED"
    assert answer["machineCommands"]["cancelled"]  # withdrawn all the same
    assert execution(runtime_engine, execution_id).error_detail["writesSucceeded"] == ["note"]


def test_a_taken_command_is_asked_to_stop_at_the_next_report_and_poll(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    execution_id, command_id = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == command_id  # the agent has it: sent

    answer = cancel(api, execution_id)

    assert answer["machineCommands"] == {"cancelled": [], "stopRequested": [said(command_id)]}
    row = command_row(runtime_engine, command_id)
    assert row.status == "sent" and row.cancel_requested_at is not None
    # A poll says so first, with nothing to run in it.
    stop = take(runtime_engine)
    assert stop.as_json() == {"id": str(command_id), "cancelRequested": True}
    # So does the next status report, over HTTP as the agent makes it.
    headers = api.headers(sub="machine:m-1", org=ORG, scopes=["agent"])
    running = api.client().post(
        f"/api/v1/agent/commands/{command_id}/status", json={"status": "running"}, headers=headers
    )
    assert running.status_code == 200
    assert running.get_json()["cancelRequested"] is True
    stopped = api.client().post(
        f"/api/v1/agent/commands/{command_id}/status",
        json={"status": "cancelled", "exitCode": -15},
        headers=headers,
    )
    assert stopped.get_json()["status"] == "cancelled"
    assert take(runtime_engine) is None  # final: the poll no longer asks


def test_a_command_of_another_execution_is_left_alone(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    first, first_command = waiting_on_a_command(runtime_engine, worker)
    _second, second_command = waiting_on_a_command(runtime_engine, worker)

    answer = cancel(api, first)

    assert answer["machineCommands"]["cancelled"] == [said(first_command)]
    assert command_row(runtime_engine, second_command).status == "pending"


def test_the_wait_fails_on_a_cancelled_command_rather_than_pass_it_on(
    worker: Executor, runtime_engine: Engine
) -> None:
    # Stopped on the machine itself (an agent may report cancelled on its own): the wait
    # takes its error exit instead of giving the decision a status to read as an end.
    execution_id, command_id = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == command_id
    with runtime_engine.begin() as conn:
        report_status(conn, org_id=ORG, machine_id="m-1", command_id=command_id, status="cancelled")

    assert run_once(runtime_engine, worker) == "FAILED"  # woken: due at once
    row = execution(runtime_engine, execution_id)
    assert row.result["toState"] == "attention"
    assert row.error_code == "COMMAND_CANCELLED"


def test_the_execution_view_and_page_say_what_the_cancel_did_on_machines(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    _, taken_command = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == taken_command
    taken_execution = _execution_of(runtime_engine, taken_command)
    pending_execution, pending_command = waiting_on_a_command(runtime_engine, worker)
    cancel(api, taken_execution)
    cancel(api, pending_execution)

    for execution_id, key, command_id in (
        (pending_execution, "cancelled", pending_command),
        (taken_execution, "stopRequested", taken_command),
    ):
        view = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG).get_json()
        other = "stopRequested" if key == "cancelled" else "cancelled"
        assert view["machineCommands"] == {key: [said(command_id)], other: []}

    client = api.client()
    signed = client.post(
        "/ui/login",
        data={"token": api.token(sub=OWNER, org=ORG)},
        headers={"Origin": "http://localhost"},
    )
    assert signed.status_code == 303
    words = " ".join(
        client.get(f"/ui/executions/{pending_execution}").get_data(as_text=True).split()
    )
    assert "cancelled before any agent took it; it will not run" in words
    words = " ".join(client.get(f"/ui/executions/{taken_execution}").get_data(as_text=True).split())
    assert "already taken; its agent was asked to stop it" in words


def _execution_of(engine: Engine, command_id: uuid.UUID) -> uuid.UUID:
    with engine.connect() as conn:
        key = conn.execute(
            text("SELECT external_key FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()
    return uuid.UUID(key.split(":")[0])


def test_a_bulk_cancel_of_waits_whose_commands_nobody_took_ends_them_all(
    worker: Executor, runtime_engine: Engine, api: Api
) -> None:
    taken, taken_command = waiting_on_a_command(runtime_engine, worker)
    assert take(runtime_engine).id == taken_command  # its agent has this one
    second, second_command = waiting_on_a_command(runtime_engine, worker)
    third, _ = waiting_on_a_command(runtime_engine, worker)

    started = api.post(
        "/executions/bulk",
        {"filter": {"status": "WAITING"}, "action": "cancel", "reason": "maintenance over"},
        org=ORG,
        scopes=["executions:cancel"],
    )
    assert started.status_code == 202, started.get_data(as_text=True)
    walk = BulkWalk()
    while act_on_chunk(runtime_engine, walk, claims_budget=10, chunk_items=10):
        pass

    statuses = {e: execution(runtime_engine, e).status for e in (taken, second, third)}
    # Only the one whose command an agent took parks for a person.
    assert statuses == {
        taken: "RECONCILIATION_REQUIRED",
        second: "CANCELLED",
        third: "CANCELLED",
    }
    assert command_row(runtime_engine, second_command).status == "cancelled"
