"""Durable waits: parked WAITING without a thread or an attempt, woken by key, deadlines kept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from orquestador.actions import Effect, NotReady, PermanentError
from orquestador.queue import cancel
from orquestador.queue.claims import claim_round
from orquestador.queue.waits import wake_waiting
from orquestador.worker.daemon import Worker
from orquestador.worker.executor import Executor
from tests.integration.worker_support import (
    ORG,
    action,
    attempt_history,
    audit,
    checkpoints,
    claim_one,
    execution,
    flow_definition,
    make_due,
    registry_of,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
    status_is,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double


def _park(engine, execution_id, wait_key: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET status = 'WAITING', wait_key = :key,
                        next_attempt_at = clock_timestamp() + interval '1 hour'
                    WHERE id = :id"""),
            {"id": execution_id, "key": wait_key},
        )


def _nothing_due(engine) -> bool:
    with engine.connect() as conn:
        return claim_round(conn, "nobody", limit=5, lease_seconds=30).claims == []


@pytest.fixture
def workers(runtime_engine) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)


def _worker(engine, started, doubles, **overrides) -> Worker:
    worker = Worker(settings(**overrides), engine, registry_of(*doubles))
    worker.start()
    started.append(worker)
    return worker


# --- wake_waiting ------------------------------------------------------------------


def test_wake_waiting_makes_only_the_waiters_on_the_key_due_and_notifies(runtime_engine):
    waiting = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    other = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    _park(runtime_engine, waiting, "machine_command:one")
    _park(runtime_engine, other, "machine_command:two")

    with runtime_engine.connect() as listener:
        listener.execute(text("LISTEN orquestador_execution_ready"))
        listener.commit()
        with runtime_engine.begin() as conn:
            assert wake_waiting(conn, "machine_command:one") == 1
            assert wake_waiting(conn, "machine_command:nobody") == 0
        raw = listener.connection.driver_connection
        heard = list(raw.notifies(timeout=2, stop_after=1))
    assert heard and heard[0].channel == "orquestador_execution_ready"

    with runtime_engine.connect() as conn:
        due = conn.execute(
            text("SELECT id FROM execution WHERE next_attempt_at <= clock_timestamp()")
        ).scalars()
        assert set(due) == {waiting}
    assert execution(runtime_engine, other).status == "WAITING"


def test_wake_in_a_rolled_back_transaction_changes_nothing(runtime_engine):
    waiting = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    _park(runtime_engine, waiting, "machine_command:x")
    with runtime_engine.connect() as conn, conn.begin() as tx:
        assert wake_waiting(conn, "machine_command:x") == 1
        tx.rollback()
    assert _nothing_due(runtime_engine)


# --- parking -----------------------------------------------------------------------


def test_twenty_not_ready_rounds_spend_no_attempt_and_keep_the_first_start(runtime_engine):
    rounds = 20

    def poll(ctx):
        if len(wait.calls) <= rounds:
            raise NotReady(3600, wait_key="machine_command:c1", observed={"n": len(wait.calls)})
        return {"status": "succeeded"}

    wait = Double("test.wait", Effect.READ_ONLY, max_attempts=1, output=poll)
    executor = Executor(registry_of(wait), settings())
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))

    for n in range(1, rounds + 1):
        assert run_once(runtime_engine, executor) == "WAITING"
        row = execution(runtime_engine, eid)
        assert (row.status, row.wait_key, row.lease_owner, row.attempts) == (
            "WAITING",
            "machine_command:c1",
            None,
            1,
        )
        assert row.next_attempt_at > datetime.now(UTC) + timedelta(minutes=50)
        assert _nothing_due(runtime_engine), "a wait was claimed before it was due"
        step = checkpoints(runtime_engine, eid)["w"]
        assert (step.status, step.error_code, step.attempt, step.observed) == (
            "FAILED",
            "NOT_READY",
            1,
            {"n": n},
        )
        make_due(runtime_engine, eid)

    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    row = execution(runtime_engine, eid)
    assert (row.status, row.attempts, row.wait_key) == ("SUCCEEDED", 1, None)
    assert [c.attempt for c in wait.calls] == [1] * (rounds + 1)
    step = checkpoints(runtime_engine, eid)["w"]
    assert (step.status, step.attempt) == ("SUCCEEDED", 1)
    # Every round saw the step's first start, as the database wrote it once.
    assert {c.first_started_at for c in wait.calls} == {step.first_started_at}
    assert step.first_started_at < step.started_at
    # No misleading history: the only line is the attempt that ended.
    assert [(h.attempt, h.status) for h in attempt_history(runtime_engine, eid, "w")] == [
        (1, "SUCCEEDED")
    ]
    assert not audit(runtime_engine, eid, "RETRY_SCHEDULED")


def test_a_wake_that_lands_while_a_later_round_runs_is_not_lost(runtime_engine):
    key = "machine_command:c5"

    def poll(ctx):
        if len(wait.calls) == 2:
            # The command's status changes while this round runs, after its read: the
            # execution is RUNNING, not WAITING, when the wake comes.
            with runtime_engine.begin() as conn:
                assert wake_waiting(conn, key) == 0
                assert wake_waiting(conn, "machine_command:other") == 0
        if len(wait.calls) <= 2:
            raise NotReady(3600, wait_key=key)
        return {"status": "succeeded"}

    wait = Double("test.wait", Effect.READ_ONLY, output=poll)
    executor = Executor(registry_of(wait), settings())
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    assert run_once(runtime_engine, executor) == "WAITING"
    assert _nothing_due(runtime_engine)
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "WAITING"
    # Due at once, not an hour later: the next claim takes it without any help.
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert len(wait.calls) == 3
    assert execution(runtime_engine, eid).wait_key is None


def test_a_wake_racing_the_park_that_commits_under_it_is_not_lost(runtime_engine):
    # A later round holds its key while RUNNING. The wake's UPDATE finds the row RUNNING,
    # blocks on the park's row lock, and re-checks the row once the park commits: it is
    # WAITING by then, and must still be made due, or the wake falls between the two.
    key = "machine_command:c6"
    wait = Double("test.wait", Effect.READ_ONLY, output=scripted(NotReady(3600, wait_key=key)))
    executor = Executor(registry_of(wait), settings())
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    assert run_once(runtime_engine, executor) == "WAITING"
    make_due(runtime_engine, eid)
    claim_one(runtime_engine, "w2")  # the next round: RUNNING, key kept
    woken: list[int] = []

    def wake() -> None:
        with runtime_engine.begin() as conn:
            woken.append(wake_waiting(conn, key))

    with runtime_engine.connect() as park:
        park.execute(
            text("""UPDATE execution SET status = 'WAITING', lease_owner = NULL,
                        lease_expires_at = NULL,
                        next_attempt_at = clock_timestamp() + interval '1 hour'
                    WHERE id = :id"""),
            {"id": eid},
        )
        waker = threading.Thread(target=wake)
        waker.start()
        wait_until(lambda: _blocked_on_a_lock(runtime_engine), what="the wake to block")
        park.commit()
    waker.join(10)
    assert woken == [1]
    assert execution(runtime_engine, eid).next_attempt_at <= datetime.now(UTC)


def _blocked_on_a_lock(engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("""SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'
                          AND query LIKE '%wait_key%'""")
            ).scalar_one()
        )


def test_a_wake_on_another_key_during_a_round_changes_nothing(runtime_engine):
    def poll(ctx):
        if len(wait.calls) == 2:
            with runtime_engine.begin() as conn:
                wake_waiting(conn, "machine_command:other")
        raise NotReady(3600, wait_key="machine_command:mine")

    wait = Double("test.wait", Effect.READ_ONLY, output=poll)
    executor = Executor(registry_of(wait), settings())
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    assert run_once(runtime_engine, executor) == "WAITING"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "WAITING"
    assert _nothing_due(runtime_engine)


def test_a_failed_round_spends_an_attempt_and_the_retry_keeps_the_first_start(runtime_engine):
    calls = []

    def poll(ctx):
        calls.append(ctx.first_started_at)
        if len(calls) == 1:
            raise NotReady(3600)
        if len(calls) == 2:
            raise RuntimeError("the read broke")
        return {"ok": True}

    wait = Double("test.wait", Effect.READ_ONLY, max_attempts=3, output=poll)
    executor = Executor(registry_of(wait), settings(retry_base_seconds=0.001))
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    assert run_once(runtime_engine, executor) == "WAITING"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert len(set(calls)) == 1 and calls[0] is not None
    assert [
        (h.attempt, h.status, h.error_code) for h in attempt_history(runtime_engine, eid, "w")
    ] == [
        (1, "FAILED", "UNCERTAIN"),
        (2, "SUCCEEDED", None),
    ]
    assert execution(runtime_engine, eid).attempts == 2  # the first claim and the retry's


def test_not_ready_from_a_writer_is_uncertain_never_a_wait(runtime_engine):
    write = Double(
        "test.write",
        Effect.IDEMPOTENT_WRITE,
        output=lambda ctx: (_ for _ in ()).throw(NotReady(60)),
    )
    charge = Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        output=lambda ctx: (_ for _ in ()).throw(NotReady(60)),
    )
    # The first execution's retry is due minutes later, so the next claim takes the second
    # (with a retry due at once, a slow machine claimed the first one again).
    executor = Executor(
        registry_of(write, charge), settings(retry_base_seconds=600, retry_cap_seconds=600)
    )
    retried = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    assert [(h.status, h.error_code) for h in attempt_history(runtime_engine, retried, "w")] == [
        ("UNKNOWN", "NOT_READY_FROM_WRITE")
    ]
    parked = start_execution(runtime_engine, flow_definition([action("c", "test.charge")]))
    assert run_once(runtime_engine, executor) == "RECONCILIATION_REQUIRED"
    assert execution(runtime_engine, parked).error_code == "UNCERTAIN_OUTCOME"
    assert execution(runtime_engine, parked).wait_key is None


def test_a_waiting_execution_can_be_cancelled(runtime_engine):
    wait = Double(
        "test.wait", Effect.READ_ONLY, output=lambda ctx: (_ for _ in ()).throw(NotReady(3600))
    )
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    assert run_once(runtime_engine, Executor(registry_of(wait), settings())) == "WAITING"
    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="not needed").status == "CANCELLED"
        )
    row = execution(runtime_engine, eid)
    assert row.status == "CANCELLED"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None
    (cancelled,) = audit(runtime_engine, eid, "EXECUTION_CANCELLED")
    assert cancelled.detail["fromStatus"] == "WAITING"
    make_due(runtime_engine, eid)
    assert _nothing_due(runtime_engine)


# --- deadlines and what the step saw -----------------------------------------------


def _deadline_wait(deadline: timedelta, command_id: str = "c-1") -> Double:
    """A wait that measures its deadline from the step's first start, as machine.wait does."""

    def poll(ctx):
        seen = {"commandId": command_id, "status": "sent", "seenAt": datetime.now(UTC).isoformat()}
        if datetime.now(UTC) - ctx.first_started_at >= deadline:
            raise PermanentError("WAIT_DEADLINE_EXCEEDED", "still sent", observed=seen)
        raise NotReady(3600, wait_key=f"machine_command:{command_id}", observed=seen)

    return Double("test.wait", Effect.READ_ONLY, max_attempts=1, output=poll)


def test_a_wait_past_its_deadline_takes_the_error_exit_with_what_it_saw(
    runtime_engine, owner_engine
):
    send = Double("test.send", Effect.IDEMPOTENT_WRITE, output={"commandId": "c-1"})
    wait = _deadline_wait(timedelta(milliseconds=300))
    executor = Executor(registry_of(send, wait), settings())
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [action("send", "test.send"), action("wait", "test.wait", onError="attention")]
        ),
    )
    statuses = []
    while not statuses or statuses[-1] == "WAITING":
        statuses.append(run_once(runtime_engine, executor))
        make_due(runtime_engine, eid)
    assert statuses[-1] == "FAILED" and len(statuses) >= 2 and set(statuses[:-1]) == {"WAITING"}
    assert len(send.calls) == 1, "the command was sent again"
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.result["toState"], row.attempts) == (
        "WAIT_DEADLINE_EXCEEDED",
        "attention",
        1,
    )
    assert request_row(runtime_engine, row.request_id).state == "attention"
    (exit_row,) = audit(runtime_engine, eid, "STEP_ERROR_EXIT")
    saw = exit_row.detail["observed"]["wait"]
    assert exit_row.detail["observed"].keys() == {"wait"}
    assert (saw["commandId"], saw["status"]) == ("c-1", "sent") and saw["seenAt"]
    assert exit_row.detail["errorCode"] == "WAIT_DEADLINE_EXCEEDED"
    assert exit_row.detail["message"] == "still sent"
    assert checkpoints(runtime_engine, eid)["wait"].observed == saw

    # Frozen: the step's row may change (or go) later, the audit row does not.
    with owner_engine.begin() as conn:
        conn.execute(
            text('UPDATE action_execution SET observed = \'{"status": "succeeded"}\'::jsonb')
        )
    (again,) = audit(runtime_engine, eid, "STEP_ERROR_EXIT")
    assert again.detail == exit_row.detail
    with pytest.raises(ProgrammingError), runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE audit_event SET detail = '{}'::jsonb WHERE id = :id"), {"id": again.id}
        )


def test_a_completed_transition_freezes_every_steps_latest_observation(
    runtime_engine, owner_engine
):
    def read(ctx):
        ctx.observe({"status": "sent", "round": len(poll.calls)})
        if len(poll.calls) == 1:
            raise NotReady(3600, observed={"status": "running"})
        ctx.observe({"status": "succeeded", "exitCode": 0})
        return {"status": "succeeded"}

    poll = Double("test.wait", Effect.READ_ONLY, output=read)
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    executor = Executor(registry_of(poll, write), settings())
    eid = start_execution(
        runtime_engine,
        flow_definition([action("wait", "test.wait"), action("save", "test.write")]),
    )
    assert run_once(runtime_engine, executor) == "WAITING"
    # The error's observation is the latest: it wins over what observe() said before it.
    assert checkpoints(runtime_engine, eid)["wait"].observed == {"status": "running"}
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    steps = checkpoints(runtime_engine, eid)
    assert steps["wait"].observed == {"status": "succeeded", "exitCode": 0}
    assert steps["save"].observed is None
    (completed,) = audit(runtime_engine, eid, "TRANSITION_COMPLETED")
    assert completed.detail["observed"] == {"wait": {"status": "succeeded", "exitCode": 0}}

    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE action_execution SET observed = NULL"))
    (again,) = audit(runtime_engine, eid, "TRANSITION_COMPLETED")
    assert again.detail == completed.detail


def test_a_transition_whose_steps_saw_nothing_has_no_observed_entry(runtime_engine):
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "SUCCEEDED"
    (completed,) = audit(runtime_engine, eid, "TRANSITION_COMPLETED")
    assert "observed" not in completed.detail


# --- with a running worker ---------------------------------------------------------


def test_a_waiting_execution_holds_no_thread(runtime_engine, workers):
    wait = Double(
        "test.wait", Effect.READ_ONLY, output=lambda ctx: (_ for _ in ()).throw(NotReady(3600))
    )
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    _worker(runtime_engine, workers, [wait, write], worker_concurrency=1, worker_batch=1)
    waiting = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    wait_until(status_is(runtime_engine, waiting, "WAITING"), what="the wait parked")
    others = [
        start_execution(runtime_engine, flow_definition([action("s", "test.write")]))
        for _ in range(3)
    ]
    for other in others:
        wait_until(status_is(runtime_engine, other, "SUCCEEDED"), what="others ran meanwhile")
    assert execution(runtime_engine, waiting).status == "WAITING"
    assert len(wait.calls) == 1


def test_wake_waiting_runs_the_waiting_step_at_once(runtime_engine, workers):
    second_round = threading.Event()

    def poll(ctx):
        if len(wait.calls) == 1:
            raise NotReady(3600, wait_key="machine_command:c9")
        second_round.set()
        return {"status": "succeeded"}

    wait = Double("test.wait", Effect.READ_ONLY, output=poll)
    # A poll far longer than the test: only the notification can wake the worker in time.
    _worker(runtime_engine, workers, [wait], worker_poll_ms=60_000)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.wait")]))
    wait_until(status_is(runtime_engine, eid, "WAITING"), what="the wait parked")
    with runtime_engine.begin() as conn:
        assert wake_waiting(conn, "machine_command:c9") == 1
    assert second_round.wait(10), "the woken execution did not run"
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), what="the woken execution ended")
    assert execution(runtime_engine, eid).attempts == 1


@pytest.mark.parametrize("on_error", [None, "attention"])
def test_a_wait_without_a_deadline_of_its_own_ends_after_wait_max_seconds(runtime_engine, on_error):
    # Regression: a NotReady wait had no bound at all.
    wait = Double(
        "test.wait", Effect.READ_ONLY, output=lambda ctx: (_ for _ in ()).throw(NotReady(3600))
    )
    executor = Executor(registry_of(wait), settings(wait_max_seconds=3600))
    extra = {"onError": on_error} if on_error else {}
    eid = start_execution(runtime_engine, flow_definition([action("wait", "test.wait", **extra)]))
    assert run_once(runtime_engine, executor) == "WAITING"
    # An hour later by the step's first start, it is still not ready: the wait ends.
    with runtime_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE action_execution SET first_started_at = first_started_at"
                " - interval '1 hour' WHERE execution_id = :id"
            ),
            {"id": eid},
        )
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "WAIT_LIMIT_EXCEEDED" and len(wait.calls) == 2
    checkpoint = checkpoints(runtime_engine, eid)["wait"]
    assert (checkpoint.status, checkpoint.error_code) == ("FAILED", "WAIT_LIMIT_EXCEEDED")
    request = request_row(runtime_engine, row.request_id)
    assert request.busy_execution_id is None
    assert request.state == (on_error or "new")
