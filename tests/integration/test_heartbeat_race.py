"""A heartbeat round that answers late never stops the next job on the same pool thread."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from orquestador.actions import ActionContext, Effect
from orquestador.queue import Claim
from orquestador.worker.daemon import Worker
from orquestador.worker.hooks import WorkerHooks
from orquestador.worker.leases import LeaseKey
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    execution,
    flow_definition,
    registry_of,
    settings,
    start_execution,
    status_is,
    wait_until,
)

WAIT = 20.0
LATE_ROUND = "late-heartbeat-round"


@pytest.fixture
def workers(runtime_engine) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)


def test_a_late_renewal_of_a_finished_job_leaves_the_next_job_on_its_thread_alone(
    runtime_engine, workers
):
    job1_in_adapter = threading.Event()
    release_job1 = threading.Event()
    job2_in_adapter = threading.Event()
    release_job2 = threading.Event()
    contexts: dict[str, ActionContext] = {}
    stop_seen_by_job2: list[bool] = []

    def adapter(ctx: ActionContext) -> dict[str, bool]:
        contexts[ctx.identity.execution_id] = ctx
        if ctx.inputs["job"] == 1:
            job1_in_adapter.set()
            assert release_job1.wait(WAIT)
        else:
            job2_in_adapter.set()
            assert release_job2.wait(WAIT)
            stop_seen_by_job2.append(ctx.should_stop())
        return {"ok": True}

    double = Double("test.read", Effect.READ_ONLY, timeout_seconds=25, output=adapter)
    claims: list[Claim] = []
    job_threads: dict[uuid.UUID, str] = {}

    def before_adapter(claim: Claim, action_id: str) -> None:  # runs on the job's thread
        job_threads[claim.execution_id] = threading.current_thread().name

    snapshots: list[list[LeaseKey]] = []
    snapshot_taken = threading.Event()

    def before_renew(keys: list[LeaseKey]) -> None:
        # The late round is the one the test drives; the worker's own rounds (every
        # 14 s, far beyond this test) pass through untouched.
        if threading.current_thread().name != LATE_ROUND:
            return
        snapshots.append(list(keys))
        snapshot_taken.set()
        # Hold the renewal back until job 1 is over and job 2 runs on the same thread.
        assert job2_in_adapter.wait(WAIT), "job 2 never reached its adapter"

    worker = Worker(
        settings(
            worker_concurrency=1,
            worker_batch=1,
            worker_lease_seconds=30,
            worker_renew_seconds=14,
        ),
        runtime_engine,
        registry_of(double),
        hooks=WorkerHooks(
            after_claim=claims.extend, before_adapter=before_adapter, before_renew=before_renew
        ),
    )
    worker.start()
    workers.append(worker)

    lost: list[tuple[LeaseKey, Claim | None]] = []
    lose = worker.leases.lose

    def recording_lose(key: LeaseKey) -> Claim | None:
        claim = lose(key)
        lost.append((key, claim))
        return claim

    worker.leases.lose = recording_lose  # type: ignore[method-assign]
    failures: list[BaseException] = []

    def late_beat() -> None:
        try:
            worker.heartbeat.beat()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    def job(number: int) -> dict:
        return flow_definition([action("r", "test.read", input={"job": {"const": number}})])

    first = start_execution(runtime_engine, job(1))
    assert job1_in_adapter.wait(WAIT)
    # Accepted only now, so the single slot decides the order: job 2 waits for job 1.
    second = start_execution(runtime_engine, job(2))

    late_round = threading.Thread(target=late_beat, name=LATE_ROUND)
    late_round.start()
    assert snapshot_taken.wait(WAIT)
    [first_claim] = claims
    stale_key = (first, first_claim.token)
    assert first_claim.execution_id == first and snapshots == [[stale_key]]

    release_job1.set()
    late_round.join(WAIT)
    assert not late_round.is_alive() and failures == []

    # Job 2 ran on job 1's pool thread (the adapter itself runs on a call thread).
    second_claim = claims[1]
    assert second_claim.execution_id == second
    assert job_threads[first] == job_threads[second]
    assert job_threads[first].startswith("orquestador-job")
    assert execution(runtime_engine, first).status == "SUCCEEDED"

    # The stale key was not renewed and the heartbeat declared it lost; nobody holds it
    # any more, so nothing was signalled, least of all the job now on that thread.
    job2 = contexts[str(second)]
    assert not job2.stop_event.is_set() and not job2.should_stop()
    assert lost == [(stale_key, None)]
    row = execution(runtime_engine, second)
    assert (row.status, row.lease_owner) == ("RUNNING", worker.worker_id)

    release_job2.set()
    wait_until(status_is(runtime_engine, second, "SUCCEEDED"), timeout=WAIT, what="job 2 done")
    assert stop_seen_by_job2 == [False]
    calls = [ctx for ctx in double.calls if ctx.identity.execution_id == str(second)]
    assert len(calls) == 1
    assert execution(runtime_engine, second).attempts == 1
