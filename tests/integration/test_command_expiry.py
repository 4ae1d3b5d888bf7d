"""Commands never arrive late: no agent is handed a command past its deliver-by time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import ActionContext, Identity, NotReady, PermanentError
from orquestador.actions.builtin.database import BuiltinDatabase
from orquestador.actions.builtin.machine import MachineAdapters
from orquestador.machines import StatusConflict, claim_next, report_status
from orquestador.machines.expiry import expire_undelivered

ORG = "org-a"


@pytest.fixture
def adapters(database) -> Iterator[MachineAdapters]:
    built_in = BuiltinDatabase(database.runtime_dsn)
    yield MachineAdapters(["poweroff", "reboot"], built_in, delivery_seconds=900)
    built_in.engine.dispose()


def context(inputs: dict, *, key: str = "exec-1:send", first_started_at=None) -> ActionContext:
    return ActionContext(
        inputs=inputs,
        external_key=key,
        attempt=1,
        deadline=10**9,
        identity=Identity(org_id=ORG, request_id="r-1", execution_id="exec-1"),
        first_started_at=first_started_at,
    )


def send(adapters: MachineAdapters, machine: str = "m-1", key: str = "exec-1:send") -> str:
    ctx = context({"machineId": machine, "command": "reboot"}, key=key)
    return adapters.send(ctx)["commandId"]


def now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def row(engine: Engine, command_id: str):
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, deliver_by, sent_at, finished_at, updated_at,"
                " deliver_by - created_at AS window FROM machine_command WHERE id = :id"
            ),
            {"id": command_id},
        ).one()


def overdue(engine: Engine, command_id: str) -> None:
    """Move the command's deliver-by time into the past, as time passing would."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE machine_command SET deliver_by = clock_timestamp() - interval '1 second'"
                " WHERE id = :id"
            ),
            {"id": command_id},
        )


def take(engine: Engine, machine: str = "m-1"):
    with engine.begin() as conn:
        return claim_next(conn, org_id=ORG, machine_id=machine)


def wait_for(adapters: MachineAdapters, command_id: str, *, deadline: int, started: datetime):
    return adapters.wait(
        context({"commandId": command_id, "deadlineSeconds": deadline}, first_started_at=started)
    )


def test_a_command_gets_command_delivery_seconds_and_its_agent_learns_what_is_left(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)

    # created_at is its transaction's start; deliver_by counts from the insert itself.
    window = row(runtime_engine, command_id).window
    assert timedelta(seconds=900) <= window < timedelta(seconds=901)
    handed = take(runtime_engine)
    assert handed is not None and str(handed.id) == command_id
    answer = handed.as_json()
    assert answer["deliverBy"] == row(runtime_engine, command_id).deliver_by.isoformat()
    assert 880 < answer["deliverWithinSeconds"] <= 900
    sent = row(runtime_engine, command_id)
    assert sent.status == "sent" and sent.sent_at < sent.deliver_by


def test_a_command_past_its_deliver_by_time_is_never_handed_out(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    late = send(adapters, key="exec-1:late")
    overdue(runtime_engine, late)
    on_time = send(adapters, key="exec-2:on-time")

    # The late one is older and would come first: it is passed over, never sent.
    handed = take(runtime_engine)
    assert handed is not None and str(handed.id) == on_time
    assert take(runtime_engine) is None
    assert row(runtime_engine, late).status == "pending"
    assert row(runtime_engine, late).sent_at is None


def test_the_maintenance_sweep_expires_only_undelivered_commands_past_their_time(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    late, on_time = send(adapters, key="exec-1:late"), send(adapters, key="exec-2:on-time")
    overdue(runtime_engine, late)
    with runtime_engine.begin() as conn:
        expired = expire_undelivered(conn, batch=10)

    assert expired == 1
    gone = row(runtime_engine, late)
    assert gone.status == "expired" and gone.finished_at is not None
    assert row(runtime_engine, on_time).status == "pending"
    with runtime_engine.begin() as conn:
        assert expire_undelivered(conn, batch=10) == 0


def test_a_wait_whose_deadline_passes_expires_its_pending_command_in_the_same_read(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    long_ago = now(runtime_engine) - timedelta(seconds=31)

    with pytest.raises(PermanentError) as failed:
        wait_for(adapters, command_id, deadline=30, started=long_ago)

    assert failed.value.code == "WAIT_DEADLINE_EXCEEDED"
    assert failed.value.observed["status"] == "expired"
    assert "never delivered" in str(failed.value)
    gone = row(runtime_engine, command_id)
    assert gone.status == "expired" and gone.sent_at is None
    # The agent that comes back now gets nothing, and cannot report on it.
    assert take(runtime_engine) is None
    with runtime_engine.begin() as conn, pytest.raises(StatusConflict):
        report_status(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command_id=uuid.UUID(command_id),
            status="running",
        )


def test_a_wait_gives_its_command_its_own_deadline_as_deliver_by_time(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    before = row(runtime_engine, command_id)
    started = now(runtime_engine)

    with pytest.raises(NotReady):
        wait_for(adapters, command_id, deadline=3600, started=started)

    moved = row(runtime_engine, command_id)
    assert moved.deliver_by == started + timedelta(seconds=3600)
    # Not a status change: a park comparing updated_at with its claim sees none.
    assert moved.updated_at == before.updated_at and moved.status == "pending"
    with pytest.raises(NotReady):
        wait_for(adapters, command_id, deadline=60, started=started)
    assert row(runtime_engine, command_id).deliver_by == started + timedelta(seconds=60)


def test_a_wait_never_revives_a_command_whose_deliver_by_time_passed(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    overdue(runtime_engine, command_id)  # written long before the wait started

    with pytest.raises(PermanentError) as failed:
        wait_for(adapters, command_id, deadline=3600, started=now(runtime_engine))

    assert failed.value.code == "COMMAND_EXPIRED"
    assert failed.value.observed["status"] == "expired"
    assert row(runtime_engine, command_id).status == "expired"
    assert take(runtime_engine) is None


def test_a_command_its_agent_refused_as_late_ends_expired_and_fails_the_wait(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    started = now(runtime_engine)
    assert take(runtime_engine) is not None

    with runtime_engine.begin() as conn:
        reported = report_status(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command_id=uuid.UUID(command_id),
            status="expired",
        )

    assert reported.status == "expired" and reported.finished_at is not None
    with pytest.raises(PermanentError) as failed:
        wait_for(adapters, command_id, deadline=600, started=started)
    assert failed.value.code == "COMMAND_EXPIRED"


def test_a_deadline_never_expires_a_command_an_agent_took(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    assert take(runtime_engine) is not None
    long_ago = now(runtime_engine) - timedelta(seconds=31)

    with pytest.raises(PermanentError) as failed:
        wait_for(adapters, command_id, deadline=30, started=long_ago)

    assert failed.value.code == "WAIT_DEADLINE_EXCEEDED"
    assert failed.value.observed["status"] == "sent"
    assert row(runtime_engine, command_id).status == "sent"  # it may be running: it goes on
