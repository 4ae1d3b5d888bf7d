"""Shutdown never drops a claim the pool was handed."""

from __future__ import annotations

import threading

from sqlalchemy import text

from orquestador.worker.daemon import Worker
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    claim_one,
    execution,
    flow_definition,
    registry_of,
    settings,
    start_execution,
    status_is,
    wait_until,
)


def test_a_claim_queued_for_a_busy_thread_still_runs_and_gives_its_lease_back(runtime_engine):
    release = threading.Event()
    first_running = threading.Event()

    def blocks_until_released(ctx):
        first_running.set()
        release.wait(20)
        return {"ok": 1}

    write = Double("test.write", output=blocks_until_released)
    ended: dict[str, str] = {}
    hooks = WorkerHooks(after_job=lambda claim, status: ended.update({claim.owner: status}))
    worker = Worker(
        settings(worker_concurrency=1, worker_batch=1, worker_drain_seconds=0.2),
        runtime_engine,
        registry_of(write),
        hooks=hooks,
        listen=False,
    )
    first = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    worker.start()
    assert first_running.wait(20)
    try:
        # The instant a finishing thread can leave behind: one more claim handed to the
        # pool while its only thread is still busy, so it waits in the pool's queue.
        second = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
        claim = claim_one(runtime_engine, "queued")
        assert claim.execution_id == second
        worker.slots.capacity += 1  # the scheduler's accounting, as in that instant
        worker.slots.take(1)
        worker._submit(claim)
        worker.request_stop()  # the drain time runs out while the first job still runs
        wait_until(lambda: worker.heartbeat.stopped.is_set(), what="the drain to give up")
    finally:
        release.set()
    assert worker.join(30)

    # The queued claim was not cancelled: it ran, saw its stop signal, gave the lease back.
    wait_until(lambda: "queued" in ended, what="the queued job to end")
    assert ended["queued"] == "ABANDONED"
    with runtime_engine.connect() as conn:
        lease_given_back = conn.execute(
            text("SELECT lease_expires_at <= clock_timestamp() FROM execution WHERE id = :id"),
            {"id": second},
        ).scalar_one()
    assert lease_given_back
    wait_until(status_is(runtime_engine, first, "SUCCEEDED"), what="the first job")
    assert execution(runtime_engine, second).status == "RUNNING"  # for lease recovery
