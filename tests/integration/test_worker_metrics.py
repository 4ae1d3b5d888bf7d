"""Worker metrics count what happened, once: lease losses and claim batches."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orquestador.actions import ActionContext, Effect
from orquestador.metrics import CLAIM_BATCH_SIZE, LEASE_LOST_TOTAL
from orquestador.worker.daemon import Worker
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    claim_one,
    expire_lease,
    flow_definition,
    registry_of,
    settings,
    start_execution,
    wait_until,
)

WAIT = 20.0


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)


def _lost() -> float:
    return float(LEASE_LOST_TOTAL._value.get())


def _claims() -> float:
    (count,) = [
        sample.value
        for metric in CLAIM_BATCH_SIZE.collect()
        for sample in metric.samples
        if sample.name.endswith("_count")
    ]
    return float(count)


def _stolen_while(
    runtime_engine: Any, workers: list[Worker], actions: list[dict[str, Any]]
) -> tuple[Worker, threading.Event, threading.Event, Any]:
    """A worker running the first action, blocked in it, whose lease another holder took."""
    in_adapter = threading.Event()
    release = threading.Event()

    def hold(ctx: ActionContext) -> dict[str, bool]:
        in_adapter.set()
        assert release.wait(WAIT)
        return {"ok": True}

    # One slot, taken by the held action: its own scheduler cannot reclaim the expired
    # lease before the thief does.
    worker = Worker(
        settings(worker_renew_seconds=10, worker_lease_seconds=30, worker_concurrency=1),
        runtime_engine,
        registry_of(Double("test.hold", Effect.READ_ONLY, output=hold)),
    )
    workers.append(worker)
    eid = start_execution(runtime_engine, flow_definition(actions))
    worker.start()
    assert in_adapter.wait(WAIT)
    # Another worker reclaims the expired lease: the first holder's token is stale.
    expire_lease(runtime_engine, eid)
    claim_one(runtime_engine, owner="thief")
    return worker, in_adapter, release, eid


def test_a_lease_lost_mid_action_is_counted_once(runtime_engine, workers) -> None:
    before = _lost()
    worker, _, release, _ = _stolen_while(runtime_engine, workers, [action("a", "test.hold")])
    worker.heartbeat.beat()  # the renewal misses: the job is told to stop
    release.set()  # its checkpoint write is then fenced: the run ends LEASE_LOST
    wait_until(lambda: worker.slots.busy == 0, WAIT, "the job to end")
    assert _lost() - before == 1


def test_a_job_stopped_between_actions_is_counted_once(runtime_engine, workers) -> None:
    # The heartbeat gave up on the lease while the first action ran (a renewal that did
    # not come back in time): the job stops before the next action and hands the lease
    # back without writing; the executor reports ABANDONED, so the daemon counts it.
    before = _lost()
    statuses: list[str] = []
    done = threading.Event()
    holder: list[Worker] = []

    def first(ctx: ActionContext) -> dict[str, bool]:
        (key,) = holder[0].leases.keys()
        holder[0].leases.lose(key)
        return {"ok": True}

    worker = Worker(
        settings(),
        runtime_engine,
        registry_of(
            Double("test.first", Effect.READ_ONLY, output=first),
            Double("test.second", Effect.READ_ONLY),
        ),
        hooks=WorkerHooks(after_job=lambda claim, status: (statuses.append(status), done.set())),
    )
    holder.append(worker)
    workers.append(worker)
    start_execution(
        runtime_engine,
        flow_definition([action("a", "test.first"), action("b", "test.second")]),
    )
    worker.start()
    assert done.wait(WAIT)
    assert statuses == ["ABANDONED"]
    assert _lost() - before == 1


def test_each_claim_that_took_work_is_one_batch_observation(runtime_engine, workers) -> None:
    before = _claims()
    done = threading.Event()
    worker = Worker(
        settings(worker_batch=4, worker_concurrency=4),
        runtime_engine,
        registry_of(Double("test.read", Effect.READ_ONLY)),
        hooks=WorkerHooks(after_job=lambda claim, status: done.set()),
    )
    workers.append(worker)
    start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    worker.start()
    assert done.wait(WAIT)
    # Idle polls that found nothing are not observations.
    assert _claims() - before == 1
