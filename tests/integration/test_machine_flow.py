"""A flow that sends a command and waits for it, run by a real worker on the built-ins."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import AdapterRegistry, NotReady
from orquestador.actions.builtin import register_builtins
from orquestador.machines import claim_next, report_status
from orquestador.queue import Resolution, resolve
from orquestador.worker.daemon import Worker
from orquestador.worker.executor import Executor
from tests.integration.worker_support import (
    ORG,
    audit,
    decommission,
    execution,
    request_row,
    run_once,
    settings,
    start_execution,
    status_is,
    wait_until,
)


@pytest.fixture
def worker(database, runtime_engine: Engine) -> Iterator[Worker]:
    configured = settings(database_url=database.runtime_dsn)
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    running = Worker(configured, runtime_engine, registry)
    running.start()
    yield running
    running.stop(timeout=30)


def command_of(engine: Engine) -> uuid.UUID:
    """Take the machine's command as its agent would, once the worker has written it."""

    def take():
        with engine.begin() as conn:
            return claim_next(conn, org_id=ORG, machine_id="m-1")

    return wait_until(take, what="the command to be written").id


def report(engine: Engine, command_id: uuid.UUID, status: str, exit_code: int | None = None):
    with engine.begin() as conn:
        return report_status(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command_id=command_id,
            status=status,
            exit_code=exit_code,
        )


def test_the_flow_waits_without_a_thread_and_resumes_at_the_report(
    worker: Worker, runtime_engine: Engine
) -> None:
    execution_id = start_execution(runtime_engine, decommission(60), {"machineId": "m-1"})
    command_id = command_of(runtime_engine)

    def parked() -> Any:
        # Status and lease read together: the wait's next round may claim it again soon.
        with runtime_engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT wait_key, lease_owner FROM execution"
                    " WHERE id = :id AND status = 'WAITING'"
                ),
                {"id": execution_id},
            ).first()

    row = wait_until(parked, what="the wait to park")
    assert row.wait_key == f"machine_command:{command_id}"
    assert row.lease_owner is None  # no worker holds it while it waits

    report(runtime_engine, command_id, "running")
    reported = time.monotonic()
    report(runtime_engine, command_id, "succeeded", 0)
    wait_until(status_is(runtime_engine, execution_id, "SUCCEEDED"), what="the flow to end")

    # Woken by the report, not by the 30 s fallback.
    assert time.monotonic() - reported < 10
    row = execution(runtime_engine, execution_id)
    assert row.result["toState"] == "done"
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.data["power"]) == ("done", "succeeded")


def test_a_deadline_shorter_than_the_command_takes_the_error_exit_with_what_it_saw(
    worker: Worker, runtime_engine: Engine
) -> None:
    execution_id = start_execution(runtime_engine, decommission(1), {"machineId": "m-1"})
    command_id = command_of(runtime_engine)  # sent, and the agent says nothing more

    wait_until(
        status_is(runtime_engine, execution_id, "FAILED", "SUCCEEDED"),
        what="the deadline to pass",
    )
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).state == "attention"
    [exit_row] = audit(runtime_engine, execution_id, "STEP_ERROR_EXIT")
    assert exit_row.detail["errorCode"] == "WAIT_DEADLINE_EXCEEDED"
    seen = exit_row.detail["observed"]["wait"]
    assert (seen["commandId"], seen["status"]) == (str(command_id), "sent")
    assert seen["seenAt"]

    # The deadline did not cancel the command: the agent still reports, the audit stands.
    assert report(runtime_engine, command_id, "succeeded", 0).changed
    [after] = audit(runtime_engine, execution_id, "STEP_ERROR_EXIT")
    assert after.detail == exit_row.detail


def test_a_command_outside_the_allow_list_takes_the_error_exit_and_writes_nothing(
    database, runtime_engine: Engine
) -> None:
    configured = settings(database_url=database.runtime_dsn, machine_commands="reboot")
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    running = Worker(configured, runtime_engine, registry)
    running.start()
    try:
        execution_id = start_execution(runtime_engine, decommission(5), {"machineId": "m-1"})
        wait_until(
            status_is(runtime_engine, execution_id, "FAILED", "SUCCEEDED"),
            what="the flow to end",
        )
    finally:
        running.stop(timeout=30)

    [exit_row] = audit(runtime_engine, execution_id, "STEP_ERROR_EXIT")
    assert exit_row.detail["errorCode"] == "COMMAND_NOT_ALLOWED"
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM machine_command")).scalar() == 0
        [message] = conn.execute(
            text("SELECT message FROM action_attempt WHERE execution_id = :id"),
            {"id": execution_id},
        ).scalars()
    # The command is a constant of the flow, so the refusal names it; the machine id,
    # read from the request data, stays out of the stored message.
    assert message == "command 'poweroff' is not in MACHINE_COMMANDS (reboot)"


def test_a_dry_run_touches_no_machine_and_says_what_it_would_have_sent(
    worker: Worker, runtime_engine: Engine
) -> None:
    execution_id = start_execution(
        runtime_engine, decommission(60), {"machineId": "m-1"}, simulation=True
    )

    wait_until(status_is(runtime_engine, execution_id, "SUCCEEDED", "FAILED"), what="the dry run")
    row = execution(runtime_engine, execution_id)
    assert (row.status, row.result["toState"]) == ("SUCCEEDED", "done")
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM machine_command")).scalar() == 0
        observed = conn.execute(
            text(
                "SELECT observed FROM action_execution "
                "WHERE execution_id = :id AND action_id = 'send'"
            ),
            {"id": execution_id},
        ).scalar_one()
    assert observed == {
        "summary": "would send poweroff to machine m-1",
        "machineId": "m-1",
        "command": "poweroff",
        "args": [],
    }


def _expire_the_wait(engine: Engine, execution_id: uuid.UUID) -> bool:
    """What the passing of the wait's deadline does, while the execution is parked WAITING.

    The execution row is taken first, only if it is still WAITING, so no round of the
    wait runs between the two writes; the next round then finds the deadline gone.
    """
    with engine.begin() as conn:
        waiting = conn.execute(
            text(
                "UPDATE execution SET next_attempt_at = now()"
                " WHERE id = :id AND status = 'WAITING' RETURNING id"
            ),
            {"id": execution_id},
        ).first()
        if waiting is None:
            return False
        conn.execute(
            text(
                "UPDATE action_execution"
                " SET first_started_at = first_started_at - interval '2 hours'"
                " WHERE execution_id = :id AND action_id = 'wait'"
            ),
            {"id": execution_id},
        )
        return True


def test_an_operator_s_retry_of_an_expired_wait_starts_a_new_deadline(
    worker: Worker, runtime_engine: Engine
) -> None:
    # Without an error exit, an expired wait after the command was sent parks: the
    # operator decides. Their retry must wait again, not find the old deadline gone.
    definition = decommission(3600)
    del definition["transitions"][0]["actions"][1]["onError"]
    execution_id = start_execution(runtime_engine, definition, {"machineId": "m-1"})
    command_id = command_of(runtime_engine)
    wait_until(lambda: _expire_the_wait(runtime_engine, execution_id), what="the wait to park")
    wait_until(
        status_is(runtime_engine, execution_id, "RECONCILIATION_REQUIRED", "FAILED", "SUCCEEDED"),
        what="the expired wait to park for a decision",
    )
    row = execution(runtime_engine, execution_id)
    assert (row.status, row.error_code) == ("RECONCILIATION_REQUIRED", "WAIT_DEADLINE_EXCEEDED")

    with runtime_engine.connect() as conn:
        decided = resolve(
            conn,
            Resolution(
                execution_id=execution_id,
                org_id=ORG,
                actor="operator-1",
                decision="retry",
                reason="the machine was off for maintenance; wait for it again",
                action_id="wait",
            ),
            output_problems=lambda capability, version, output: [],
            claims_budget=10,
        )
    assert decided == "PENDING"

    wait_until(
        status_is(runtime_engine, execution_id, "WAITING", "RECONCILIATION_REQUIRED", "FAILED"),
        what="the retried wait to run",
    )
    row = execution(runtime_engine, execution_id)
    assert (row.status, row.wait_key) == ("WAITING", f"machine_command:{command_id}")
    report(runtime_engine, command_id, "succeeded", 0)
    wait_until(status_is(runtime_engine, execution_id, "SUCCEEDED"), what="the flow to end")
    row = execution(runtime_engine, execution_id)
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.data["power"], request.busy_execution_id) == (
        "done",
        "succeeded",
        None,
    )
    (resolved,) = audit(runtime_engine, execution_id, "RECONCILIATION_RESOLVED")
    assert (resolved.actor, resolved.detail["decision"]) == ("operator-1", "retry")
    assert resolved.detail["parkedFor"] == "WAIT_DEADLINE_EXCEEDED"


def test_a_report_landing_between_a_first_round_s_read_and_its_park_wakes_it_at_once(
    database, runtime_engine: Engine
) -> None:
    # The first round of a wait has no wait key on its row until it parks, so the
    # report's wake finds nothing to mark. Forced here: the agent takes the command, the
    # round reads it `sent`, the report of `running` commits, and only then the park.
    configured = settings(database_url=database.runtime_dsn)
    builtins = AdapterRegistry()
    register_builtins(builtins, configured)
    wait = builtins.get("machine.wait", 1)
    read_sent, reported = threading.Event(), threading.Event()
    taken: list[uuid.UUID] = []
    seen: list[str] = []

    def read_then_let_the_report_in(ctx: Any) -> Any:
        taken.append(command_of(runtime_engine))  # the agent's poll: sent
        try:
            return wait.invoke(ctx)
        except NotReady as not_ready:
            seen.append(not_ready.observed["status"])
            read_sent.set()
            assert reported.wait(10), "the report never committed"
            raise

    registry = AdapterRegistry()
    for adapter in builtins.adapters():
        registry.add(
            replace(adapter, invoke=read_then_let_the_report_in) if adapter is wait else adapter
        )

    def agent_reports() -> None:
        if read_sent.wait(10):
            report(runtime_engine, taken[0], "running")
            reported.set()

    reporter = threading.Thread(target=agent_reports)
    reporter.start()
    execution_id = start_execution(runtime_engine, decommission(600), {"machineId": "m-1"})
    assert run_once(runtime_engine, Executor(registry, configured)) == "WAITING"
    reporter.join(10)
    assert seen == ["sent"]  # what the round read, before the report committed

    row = execution(runtime_engine, execution_id)
    # Due at once (at the park's own time), not at a recheck a second later.
    assert (row.next_attempt_at - row.updated_at).total_seconds() < 0.1, (
        row.next_attempt_at,
        row.updated_at,
    )
