"""The worker's threads together: capacity-bounded claims, wake-up, heartbeats and shutdown."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from orquestador.actions import Effect
from orquestador.db.engine import make_engine
from orquestador.worker.daemon import Worker
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    accept_transition,
    action,
    checkpoints,
    claim_one,
    create_request,
    execution,
    expire_lease,
    flow_definition,
    publish_flow,
    registry_of,
    settings,
    start_execution,
    status_is,
    wait_until,
)


@pytest.fixture
def workers(runtime_engine) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)


def _worker(engine, started, doubles, hooks=NO_HOOKS, **overrides) -> Worker:
    worker = Worker(settings(**overrides), engine, registry_of(*doubles), hooks=hooks)
    worker.start()
    started.append(worker)
    return worker


def _statuses(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM execution GROUP BY status"))
        return dict(rows.all())


def test_a_worker_runs_everything_accepted(runtime_engine, workers):
    write = Double("test.write")
    _worker(runtime_engine, workers, [write])
    flow_id = publish_flow(runtime_engine, flow_definition([action("w", "test.write")]))
    for _ in range(25):
        accept_transition(runtime_engine, create_request(runtime_engine, flow_id))
    wait_until(lambda: _statuses(runtime_engine) == {"SUCCEEDED": 25}, what="all succeeded")
    assert len(write.calls) == 25


def test_the_scheduler_never_claims_more_than_its_free_slots(runtime_engine, workers):
    gate = threading.Event()
    both_running = threading.Barrier(3)
    write = Double(
        "test.write",
        output=lambda ctx: (
            both_running.wait(10) if ctx.attempt == 1 else None,
            gate.wait(20),
            {"ok": 1},
        )[-1],
    )
    seen: list[tuple[int, int]] = []
    worker = None

    def after_claim(claims):
        seen.append((len(claims), worker.slots.busy if worker else -1))

    flow_id = publish_flow(runtime_engine, flow_definition([action("w", "test.write")]))
    for _ in range(6):
        accept_transition(runtime_engine, create_request(runtime_engine, flow_id))
    worker = _worker(
        runtime_engine,
        workers,
        [write],
        WorkerHooks(after_claim=after_claim),
        worker_concurrency=2,
        worker_batch=10,
    )
    both_running.wait(10)
    # An observation window: the scheduler polls every 50 ms and must keep claiming nothing.
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:
        assert _statuses(runtime_engine) == {"RUNNING": 2, "PENDING": 4}
    gate.set()
    wait_until(lambda: _statuses(runtime_engine) == {"SUCCEEDED": 6}, what="all succeeded")
    assert all(busy <= 2 for _, busy in seen) and all(n <= 2 for n, _ in seen)


def test_an_idle_worker_wakes_on_notify_long_before_its_poll(runtime_engine, workers):
    write = Double("test.write")
    idle_while_listening = threading.Event()
    worker = Worker(
        settings(worker_poll_ms=30_000),
        runtime_engine,
        registry_of(write),
        hooks=WorkerHooks(
            before_idle_wait=lambda: (
                worker.listener.listening.is_set() and idle_while_listening.set()
            )
        ),
    )
    worker.start()
    workers.append(worker)
    # LISTEN wakes the scheduler once; its claim finds nothing and it goes to sleep for
    # 30 s with the listener in place: only a notification can wake it in time now.
    assert idle_while_listening.wait(10)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), timeout=5, what="woken by notify")


def test_renewal_keeps_a_long_execution_alive_past_the_original_lease(runtime_engine, workers):
    # Each action stays below its timeout (and so below the lease); together they run
    # past the lease the claim took, which only renewal makes possible.
    first_lease = {}
    # The action may start before the claim's hook has run: it waits for the hook.
    claimed = threading.Event()

    def db_now():
        with runtime_engine.connect() as conn:
            return conn.execute(text("SELECT clock_timestamp()")).scalar_one()

    def long_action(ctx):
        eid = ctx.identity.execution_id
        assert claimed.wait(timeout=20), "the claim's hook never ran"
        if ctx.inputs["step"] == 1:
            wait_until(
                lambda: (
                    execution(runtime_engine, eid).lease_expires_at
                    > first_lease["at"] + _seconds(1.5)
                ),
                timeout=20,
                what="a renewal",
            )
        else:
            wait_until(lambda: db_now() > first_lease["at"], timeout=20, what="the first lease")
        return {"ok": 1}

    write = Double("test.write", timeout_seconds=2.9, output=long_action)
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [
                action("a", "test.write", input={"step": {"const": 1}}),
                action("b", "test.write", input={"step": {"const": 2}}),
            ]
        ),
    )

    def after_claim(claims):
        first_lease["at"] = claims[0].lease_expires_at
        claimed.set()

    _worker(
        runtime_engine,
        workers,
        [write],
        WorkerHooks(after_claim=after_claim),
        worker_lease_seconds=3,
        worker_renew_seconds=1,
    )
    _worker(runtime_engine, workers, [write], worker_lease_seconds=3, worker_renew_seconds=1)
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), timeout=30)
    row = execution(runtime_engine, eid)
    assert row.attempts == 1 and row.fencing_token == 1 and len(write.calls) == 2


def _seconds(n: float):
    from datetime import timedelta

    return timedelta(seconds=n)


def test_a_lost_lease_sets_the_jobs_stop_signal(runtime_engine, workers):
    saw_stop = threading.Event()

    def until_stopped(ctx):
        if wait_until(ctx.should_stop, timeout=20, what="stop signal"):
            saw_stop.set()
        return {"ok": 1}

    # Its deadline is far beyond the test: only the lost lease can make should_stop true.
    write = Double("test.write", timeout_seconds=30, output=until_stopped)
    claimed = threading.Event()
    _worker(
        runtime_engine,
        workers,
        [write],
        WorkerHooks(after_claim=lambda c: claimed.set()),
        worker_lease_seconds=40,
        worker_renew_seconds=1,
        # Its one slot is the running job's: the worker cannot reclaim the expired row
        # itself before the thief does.
        worker_concurrency=1,
        worker_batch=1,
    )
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert claimed.wait(10)
    wait_until(lambda: write.calls, what="adapter running")
    expire_lease(runtime_engine, eid)
    thief = claim_one(runtime_engine, "thief")
    assert saw_stop.wait(10)
    row = execution(runtime_engine, eid)
    assert (row.lease_owner, row.fencing_token, row.status) == ("thief", thief.token, "RUNNING")
    # The stale holder's success was refused: a safe step's attempt is written only when
    # it ends, by its holder, so the step has no checkpoint at all.
    assert "w" not in checkpoints(runtime_engine, eid)


def test_warm_stop_finishes_running_work_and_claims_nothing_more(runtime_engine, workers):
    gate = threading.Event()
    write = Double("test.write", output=lambda ctx: (gate.wait(20), {"ok": 1})[1])
    worker = _worker(runtime_engine, workers, [write], worker_drain_seconds=20)
    running = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    wait_until(lambda: write.calls, what="adapter running")
    worker.request_stop()
    worker.scheduler.join(5)
    later = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert not worker.join(0.2), "stopped before its job finished"
    gate.set()
    assert worker.join(20) and worker.drained_cleanly
    assert execution(runtime_engine, running).status == "SUCCEEDED"
    assert execution(runtime_engine, later).status == "PENDING"


def test_join_returns_only_after_the_background_threads_have_ended(runtime_engine, workers, caplog):
    # `orquestador dev` stops the database right after join(): a listener or heartbeat
    # still running then would fail on it and log a disconnection at every shutdown.
    write = Double("test.write")
    worker = _worker(runtime_engine, workers, [write], worker_renew_seconds=1)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), what="job done")
    assert worker.listener is not None
    wait_until(worker.listener.is_alive, what="listener started")
    with caplog.at_level("INFO", logger="orquestador.worker"):
        assert worker.stop(timeout=20)
    threads = {
        "scheduler": worker.scheduler,
        "heartbeat": worker.heartbeat,
        "listener": worker.listener,
    }
    assert [name for name, thread in threads.items() if thread.is_alive()] == []
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_drain_timeout_stops_jobs_and_another_worker_recovers(runtime_engine, workers):
    def until_stopped(ctx):
        wait_until(ctx.should_stop, timeout=20, what="stop signal")
        return {"value": 7}

    slow = Double("test.slow", Effect.IDEMPOTENT_WRITE, output=until_stopped)
    worker = _worker(runtime_engine, workers, [slow], worker_drain_seconds=1)
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [
                action("slow", "test.slow"),
                action("next", "test.next", input={"v": {"from": "/actions/slow/value"}}),
            ]
        ),
    )
    wait_until(lambda: slow.calls, what="adapter running")
    worker.request_stop()
    assert worker.join(10) and not worker.drained_cleanly
    # Between actions the job saw the stop signal and gave the lease back.
    wait_until(
        lambda: (
            execution(runtime_engine, eid).lease_owner
            and checkpoints(runtime_engine, eid).get("slow") is not None
            and checkpoints(runtime_engine, eid)["slow"].status == "SUCCEEDED"
        ),
        what="checkpoint",
    )

    nxt = Double("test.next", Effect.READ_ONLY, output=lambda ctx: {"got": ctx.inputs["v"]})
    _worker(runtime_engine, workers, [Double("test.slow"), nxt])
    wait_until(status_is(runtime_engine, eid, "SUCCEEDED"), timeout=20, what="recovered")
    assert len(slow.calls) == 1 and [c.inputs for c in nxt.calls] == [{"v": 7}]
    assert execution(runtime_engine, eid).attempts == 2


def test_worker_refuses_an_adapter_whose_timeout_is_not_below_the_lease(runtime_engine):
    from orquestador.errors import ConfigError

    with pytest.raises(ConfigError, match="not below"):
        Worker(
            settings(worker_lease_seconds=10, worker_renew_seconds=2),
            runtime_engine,
            registry_of(Double("test.slow", timeout_seconds=10)),
        )


def test_expire_lease_helper_matches_database_time(runtime_engine):
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    claim_one(runtime_engine)
    expire_lease(runtime_engine, eid)
    assert claim_one(runtime_engine, "w2").token == 2


def test_a_connection_that_died_while_idle_is_replaced_before_use(database):
    # The worker's engine pings only connections that sat idle; one that the server
    # dropped in the meantime must never reach a job.
    engine = make_engine(
        database.runtime_dsn, pool_size=1, max_overflow=0, ping_after_idle_seconds=0
    )
    killer = make_engine(database.runtime_dsn)
    try:
        with engine.connect() as conn:
            dead = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with killer.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": dead}).scalar()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != dead
    finally:
        engine.dispose()
        killer.dispose()


def test_a_request_locked_by_another_session_stalls_only_its_own_execution(runtime_engine, workers):
    # Regression (head-of-line blocking): an operator's open transaction holding one
    # request stalled the worker's writer, and every other execution with it, while
    # all their leases kept being renewed.
    write = Double("test.write", timeout_seconds=2, output=lambda ctx: {"ok": ctx.external_key})
    flow_id = publish_flow(runtime_engine, flow_definition([action("w", "test.write")]))
    requests = [create_request(runtime_engine, flow_id) for _ in range(3)]
    held_request = requests[0]
    held, *others = [accept_transition(runtime_engine, r) for r in requests]
    stranger = runtime_engine.connect()
    transaction = stranger.begin()
    stranger.execute(text("SELECT 1 FROM request WHERE id = :id FOR UPDATE"), {"id": held_request})
    try:
        _worker(
            runtime_engine,
            workers,
            [write],
            worker_lease_seconds=4,
            worker_renew_seconds=1,
            worker_lock_timeout_ms=300,
        )
        for other in others:
            wait_until(status_is(runtime_engine, other, "SUCCEEDED"), what="others finish")
        # The held one gave up its finish and its lease: not renewed any more, it is
        # taken again once the lease ran out, and stays RUNNING while the lock is held.
        token = execution(runtime_engine, held).fencing_token
        wait_until(
            lambda: execution(runtime_engine, held).fencing_token > token,
            what="the held execution reclaimed after its lease ran out",
        )
        assert execution(runtime_engine, held).status == "RUNNING"
        assert checkpoints(runtime_engine, held)["w"].status == "SUCCEEDED"
    finally:
        transaction.rollback()
        stranger.close()
    wait_until(status_is(runtime_engine, held, "SUCCEEDED"), what="held one finishes")
    # Its step ran once: recovery went on from the SUCCEEDED checkpoint.
    assert sum(1 for ctx in write.calls if ctx.external_key.startswith(str(held))) == 1
    with runtime_engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, busy_execution_id FROM request WHERE id = :id"),
            {"id": held_request},
        ).one()
    assert row.busy_execution_id is None and row.state == "done"
