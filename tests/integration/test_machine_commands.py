"""The command store and the machine adapters against a real database."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import ActionContext, Identity, NotReady, PermanentError
from orquestador.actions.builtin.database import BuiltinDatabase
from orquestador.actions.builtin.machine import MachineAdapters
from orquestador.machines import (
    StatusConflict,
    claim_next,
    delete_final_commands,
    find_command,
    next_command,
    report_status,
)
from orquestador.machines.bell import CommandBell

ORG = "org-a"


@pytest.fixture
def adapters(database) -> Iterator[MachineAdapters]:
    built_in = BuiltinDatabase(database.runtime_dsn)
    yield MachineAdapters(["poweroff", "reboot"], built_in)
    built_in.engine.dispose()


def context(inputs: dict, *, key: str = "exec-1:send", org: str = ORG, first_started_at=None):
    return ActionContext(
        inputs=inputs,
        external_key=key,
        attempt=1,
        deadline=10**9,
        identity=Identity(org_id=org, request_id="r-1", execution_id="exec-1"),
        first_started_at=first_started_at,
    )


def send(adapters: MachineAdapters, machine: str = "m-1", **kw) -> str:
    ctx = context({"machineId": machine, "command": "poweroff"}, **kw)
    return adapters.send(ctx)["commandId"]


def test_the_same_external_key_twice_makes_one_command(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    first = adapters.send(context({"machineId": "m-1", "command": "poweroff"}))
    second = adapters.send(context({"machineId": "m-1", "command": "poweroff"}))

    assert first == second == {"commandId": first["commandId"], "status": "pending"}
    with runtime_engine.connect() as conn:
        rows = conn.execute(text("SELECT org_id, machine_id, command FROM machine_command")).all()
    assert [tuple(r) for r in rows] == [(ORG, "m-1", "poweroff")]


def test_a_command_outside_the_allow_list_is_refused_and_writes_nothing(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    with pytest.raises(PermanentError) as refused:
        adapters.send(context({"machineId": "m-1", "command": "rm-rf"}))

    assert refused.value.code == "COMMAND_NOT_ALLOWED"
    assert "MACHINE_COMMANDS" in str(refused.value)
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM machine_command")).scalar() == 0


def test_simulation_writes_no_row_and_observes_what_it_would_do(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    ctx = context({"machineId": "m-1", "command": "poweroff"})

    output = adapters.simulate_send(ctx)

    assert output["status"] == "pending" and uuid.UUID(output["commandId"])
    assert ctx.observed == {
        "summary": "would send poweroff to machine m-1",
        "machineId": "m-1",
        "command": "poweroff",
        "args": [],
    }
    wait = context({"commandId": output["commandId"], "deadlineSeconds": 5})
    assert adapters.simulate_wait(wait) == {
        "commandId": output["commandId"],
        "status": "succeeded",
        "exitCode": 0,
    }
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM machine_command")).scalar() == 0


def _now(engine: Engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def test_wait_is_not_ready_before_the_deadline_and_answers_a_final_status(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    started = _now(runtime_engine)
    ctx = context({"commandId": command_id, "deadlineSeconds": 60}, first_started_at=started)

    with pytest.raises(NotReady) as waiting:
        adapters.wait(ctx)
    assert waiting.value.wait_key == f"machine_command:{command_id}"
    # The first round looks again within a second: a change landing between its read and
    # its park (before its wait key is recorded) is seen then.
    assert 0 < waiting.value.check_again_in <= 1
    assert waiting.value.observed["status"] == "pending"
    later = context(
        {"commandId": command_id, "deadlineSeconds": 600},
        first_started_at=started - timedelta(seconds=20),
    )
    with pytest.raises(NotReady) as still:
        adapters.wait(later)
    # Later rounds keep their key while they run and are woken at once; they look again
    # less often the longer they have waited, up to 30 s.
    assert 20 <= still.value.check_again_in <= 30

    with runtime_engine.begin() as conn:
        claim_next(conn, org_id=ORG, machine_id="m-1")
        report_status(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command_id=uuid.UUID(command_id),
            status="failed",
            exit_code=3,
        )
    done = context({"commandId": command_id, "deadlineSeconds": 60}, first_started_at=started)
    assert adapters.wait(done) == {"commandId": command_id, "status": "failed", "exitCode": 3}
    assert done.observed["status"] == "failed" and done.observed["commandId"] == command_id


def test_wait_past_its_deadline_fails_with_what_it_saw_and_leaves_the_command(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters)
    with runtime_engine.begin() as conn:
        claim_next(conn, org_id=ORG, machine_id="m-1")
    long_ago = _now(runtime_engine) - timedelta(seconds=31)
    ctx = context({"commandId": command_id, "deadlineSeconds": 30}, first_started_at=long_ago)

    with pytest.raises(PermanentError) as failed:
        adapters.wait(ctx)

    assert failed.value.code == "WAIT_DEADLINE_EXCEEDED"
    assert failed.value.observed["commandId"] == command_id
    assert failed.value.observed["status"] == "sent"
    assert failed.value.observed["seenAt"].endswith("Z")
    with runtime_engine.connect() as conn:
        found = find_command(conn, org_id=ORG, command_id=uuid.UUID(command_id))
    assert found is not None and found.status == "sent"  # never cancelled


def test_wait_for_another_organizations_command_is_not_found(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = send(adapters, key="exec-2:send", org="org-b")
    started = _now(runtime_engine)

    for candidate in (command_id, str(uuid.uuid4()), "not-a-uuid"):
        with pytest.raises(PermanentError) as missing:
            adapters.wait(
                context({"commandId": candidate, "deadlineSeconds": 5}, first_started_at=started)
            )
        assert missing.value.code == "COMMAND_NOT_FOUND"


def test_statuses_only_move_forward(adapters: MachineAdapters, runtime_engine: Engine) -> None:
    command_id = uuid.UUID(send(adapters))
    where = {"org_id": ORG, "machine_id": "m-1", "command_id": command_id}

    with runtime_engine.begin() as conn, pytest.raises(StatusConflict):
        report_status(conn, **where, status="running")  # not sent yet
    with runtime_engine.begin() as conn:
        claim_next(conn, org_id=ORG, machine_id="m-1")
        assert report_status(conn, **where, status="running").changed
        assert not report_status(conn, **where, status="running").changed
        assert report_status(conn, **where, status="succeeded", exit_code=0).changed
        again = report_status(conn, **where, status="succeeded", exit_code=9)
    assert (again.changed, again.exit_code) == (False, 0)  # the first report stands
    for later in ("running", "failed", "timed_out"):
        with runtime_engine.begin() as conn, pytest.raises(StatusConflict):
            report_status(conn, **where, status=later)


def test_output_is_kept_up_to_its_bound_as_head_and_tail(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    command_id = uuid.UUID(send(adapters))
    with runtime_engine.begin() as conn:
        claim_next(conn, org_id=ORG, machine_id="m-1")
        reported = report_status(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command_id=command_id,
            status="succeeded",
            exit_code=0,
            output="a" * 60_000 + "z" * 40_000,
            output_max_bytes=65536,
        )
        kept = conn.execute(
            text("SELECT output, output_tail, output_size FROM machine_command WHERE id = :id"),
            {"id": command_id},
        ).one()
    assert reported.output_truncated and reported.output_received == 100_000
    # The first half of the bound from the start, the latest half, the rest counted.
    assert (kept.output, kept.output_tail) == ("a" * 32768, "z" * 32768)
    assert kept.output_size == 100_000


def test_a_status_change_wakes_the_execution_waiting_on_the_command(
    adapters: MachineAdapters, runtime_engine: Engine, owner_engine: Engine
) -> None:
    command_id = uuid.UUID(send(adapters))
    execution_id = _parked_execution(owner_engine, f"machine_command:{command_id}")

    with runtime_engine.begin() as conn:
        claim_next(conn, org_id=ORG, machine_id="m-1")

    with owner_engine.connect() as conn:
        due = conn.execute(
            text("SELECT next_attempt_at <= clock_timestamp() FROM execution WHERE id = :id"),
            {"id": execution_id},
        ).scalar_one()
    assert due


def _parked_execution(owner_engine: Engine, key: str) -> uuid.UUID:
    """A WAITING execution on `key`, due in an hour, arranged as the owner."""
    with owner_engine.begin() as conn:
        flow_id = conn.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema, "
                "created_by) VALUES (:org, 'f', 1, 'manual', '{}', '{}', 'alice') RETURNING id"
            ),
            {"org": ORG},
        ).scalar_one()
        request_id = conn.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, "
                "created_by) VALUES (:org, 'alice', :flow, 'new', 1, '{}', 'alice') RETURNING id"
            ),
            {"org": ORG, "flow": flow_id},
        ).scalar_one()
        return conn.execute(
            text(
                "INSERT INTO execution (org_id, request_id, flow_id, transition_id, status, "
                "accepted_revision, accepted_state, actor_snapshot, next_attempt_at, wait_key) "
                "VALUES (:org, :request, :flow, 't', 'WAITING', 1, 'new', '{}', "
                "clock_timestamp() + interval '1 hour', :key) RETURNING id"
            ),
            {"org": ORG, "request": request_id, "flow": flow_id, "key": key},
        ).scalar_one()


def test_two_agents_polling_at_once_never_take_the_same_command(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    for n in range(20):
        send(adapters, key=f"exec-{n}:send")
    taken: list[uuid.UUID] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def agent() -> None:
        start.wait()
        while command := next_command(runtime_engine, org_id=ORG, machine_id="m-1", wait_seconds=0):
            with lock:
                taken.append(command.id)

    threads = [threading.Thread(target=agent) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert len(taken) == len(set(taken)) == 20


def test_a_long_poll_answers_as_soon_as_a_command_arrives(
    adapters: MachineAdapters, runtime_engine: Engine
) -> None:
    looked = threading.Event()
    got: list = []

    def poll() -> None:
        got.append(
            next_command(
                runtime_engine,
                org_id=ORG,
                machine_id="m-1",
                wait_seconds=20,
                on_empty_look=looked.set,
            )
        )

    poller = threading.Thread(target=poll)
    poller.start()
    assert looked.wait(10)
    command_id = send(adapters)
    poller.join(5)

    assert not poller.is_alive(), "the long poll did not answer within 5 s of the command"
    assert got[0] is not None and str(got[0].id) == command_id


def test_retention_deletes_old_final_commands_in_batches(
    adapters: MachineAdapters, runtime_engine: Engine, owner_engine: Engine
) -> None:
    ids = [uuid.UUID(send(adapters, key=f"exec-{n}:send")) for n in range(5)]
    with runtime_engine.begin() as conn:
        for command_id in ids[:4]:
            claim_next(conn, org_id=ORG, machine_id="m-1")
            report_status(
                conn, org_id=ORG, machine_id="m-1", command_id=command_id, status="succeeded"
            )
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE machine_command SET finished_at = clock_timestamp() - interval '40 days'"
                " WHERE id = ANY(:ids)"
            ),
            {"ids": ids[:3]},
        )

    with runtime_engine.begin() as conn:
        assert delete_final_commands(conn, older_than_days=30, batch=2) == 2
    with runtime_engine.begin() as conn:
        assert delete_final_commands(conn, older_than_days=30, batch=2) == 1
        assert delete_final_commands(conn, older_than_days=30, batch=2) == 0
    with runtime_engine.begin() as conn:
        assert delete_final_commands(conn, older_than_days=0, batch=10) == 1
        left = conn.execute(text("SELECT id, status FROM machine_command")).all()
    assert [tuple(r) for r in left] == [(ids[4], "pending")]


def test_the_bell_wakes_a_long_poll_the_moment_a_command_is_written(
    adapters: MachineAdapters, database, runtime_engine: Engine
) -> None:
    conninfo = database.runtime_url.set(drivername="postgresql")
    bell = CommandBell(conninfo.render_as_string(hide_password=False), idle_seconds=1)
    looked = threading.Event()
    got: list = []

    def poll() -> None:
        # Looks only every 20 s on its own: an answer within seconds is the bell's doing.
        got.append(
            next_command(
                runtime_engine,
                org_id=ORG,
                machine_id="m-1",
                wait_seconds=25,
                bell=bell,
                poll_seconds=20,
                bell_fallback_seconds=20,
                on_empty_look=looked.set,
            )
        )

    poller = threading.Thread(target=poll)
    poller.start()
    assert looked.wait(10) and bell.listening.wait(10)
    command_id = send(adapters)
    poller.join(5)

    assert not poller.is_alive(), "the bell did not wake the long poll"
    assert str(got[0].id) == command_id
    # Nobody subscribes any more: the bell's thread closes its connection and ends.
    gone = threading.Event()
    for _ in range(100):
        if not bell.running and not bell.listening.is_set():
            gone.set()
            break
        gone.wait(0.1)
    assert gone.is_set()
