"""Bulk actions under concurrency: two workers on one bulk, a failure mid-item, an operator and
a claim at the same execution. Interleavings are forced with barriers and events."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from orquestador.actions import AdapterRegistry, Effect, UncertainError
from orquestador.queue import claim_round
from orquestador.queue.bulk import BulkWalk, RunningBulk, act_on_chunk
from orquestador.queue.claims import _CLAIM
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, running_api
from tests.integration.bulk_support import (
    STEP,
    arrange,
    audits,
    items,
    parked,
    publish,
    statuses,
)
from tests.integration.worker_support import (
    ORG,
    RecordingAdapter,
    run_once,
    scripted,
    settings,
    wait_until,
)

REASON = "the provider's maintenance window"
OPERATOR: dict[str, Any] = {
    "org": ORG,
    "sub": "carol",
    "scopes": ["executions:cancel", "executions:reconcile", "requests:read-all"],
}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _start(api: Api, flow: uuid.UUID) -> str:
    body = {"filter": {"flowId": str(flow)}, "action": "cancel", "reason": REASON}
    response = api.post("/executions/bulk", body, **OPERATOR)
    assert response.status_code == 202, response.get_data(as_text=True)
    return response.get_json()["bulkId"]


def _progress(api: Api, bulk_id: str) -> dict[str, Any]:
    return api.get(f"/bulk/{bulk_id}", **OPERATOR).get_json()


def _run_to_end(engine: Engine, walk: BulkWalk | None = None, **options: Any) -> int:
    walk = walk or BulkWalk()
    acted = 0
    while done := act_on_chunk(engine, walk, claims_budget=10, chunk_items=5, **options):
        acted += done
    return acted


def _waiting_on_a_lock(owner_engine: Engine) -> bool:
    with owner_engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_two_workers_on_one_bulk_never_take_the_same_item(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 40)
    bulk_id = _start(api, flow)
    # Both workers hold an item at the same moment before either acts: SKIP LOCKED must
    # have handed them different ones.
    both_hold_one = threading.Barrier(2, timeout=20)
    taken: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
    failures: list[BaseException] = []

    def worker(name: str) -> None:
        def on_taken(bulk: RunningBulk, execution_id: uuid.UUID) -> None:
            taken[name].append(execution_id)
            if len(taken[name]) == 1:
                both_hold_one.wait()

        try:
            _run_to_end(runtime_engine, on_taken=on_taken)
        except BaseException as failure:  # reported by the main thread
            failures.append(failure)

    threads = [threading.Thread(target=worker, args=(name,)) for name in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
    assert taken["a"] and taken["b"]
    assert not set(taken["a"]) & set(taken["b"])
    assert sorted(taken["a"] + taken["b"]) == pending
    cancelled = audits(owner_engine, "EXECUTION_CANCELLED")
    assert set(cancelled) == set(pending)
    assert all(len(rows) == 1 for rows in cancelled.values())
    shown = _progress(api, bulk_id)
    assert (shown["status"], shown["done"], shown["succeeded"]) == ("DONE", 40, 40)


def test_a_bulk_ends_only_once_every_item_has_its_outcome(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 5)
    bulk_id = _start(api, flow)
    holding, release = threading.Event(), threading.Event()

    def hold_the_first(bulk: RunningBulk, execution_id: uuid.UUID) -> None:
        if execution_id == pending[0]:
            holding.set()
            assert release.wait(20)

    slow = threading.Thread(
        target=act_on_chunk,
        args=(runtime_engine, BulkWalk()),
        kwargs={"claims_budget": 10, "chunk_items": 1, "on_taken": hold_the_first},
    )
    slow.start()
    try:
        assert holding.wait(20)
        # Another worker acts on every other item, finds the held one locked, and stops.
        assert _run_to_end(runtime_engine) == 4
        shown = _progress(api, bulk_id)
        assert (shown["status"], shown["done"]) == ("RUNNING", 4)
    finally:
        release.set()
        slow.join(20)
    # The last item's worker ends the bulk as soon as it is done with it.
    shown = _progress(api, bulk_id)
    assert (shown["status"], shown["done"], shown["succeeded"]) == ("DONE", 5, 5)


class ItemFailed(Exception):
    """Stands for the connection dying after the item's action, before its outcome."""


def test_a_failure_after_the_action_before_the_outcome_undoes_the_action(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 6)
    bulk_id = _start(api, flow)
    records = {"seen": 0}

    def fail_the_third_record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        # The item's outcome, after its cancel wrote everything, inside one transaction.
        if statement.lstrip().startswith("UPDATE bulk_item"):
            records["seen"] += 1
            if records["seen"] == 3:
                raise ItemFailed

    event.listen(runtime_engine, "before_cursor_execute", fail_the_third_record)
    try:
        with pytest.raises(ItemFailed):
            act_on_chunk(runtime_engine, BulkWalk(), claims_budget=10, chunk_items=10)
    finally:
        event.remove(runtime_engine, "before_cursor_execute", fail_the_third_record)

    interrupted = pending[2]
    assert items(owner_engine, bulk_id)[interrupted].outcome is None
    assert statuses(owner_engine, [interrupted]) == {interrupted: "PENDING"}
    assert interrupted not in audits(owner_engine, "EXECUTION_CANCELLED")
    with owner_engine.connect() as conn:
        busy = conn.execute(
            text(
                "SELECT r.busy_execution_id FROM request r JOIN execution e"
                " ON e.request_id = r.id WHERE e.id = :id"
            ),
            {"id": interrupted},
        ).scalar_one()
    assert busy == interrupted

    assert _run_to_end(runtime_engine) == 4
    cancelled = audits(owner_engine, "EXECUTION_CANCELLED")
    assert set(cancelled) == set(pending)
    assert all(len(rows) == 1 for rows in cancelled.values())
    assert _progress(api, bulk_id)["succeeded"] == 6


def test_an_operator_cancelling_an_item_the_bulk_holds_waits_and_is_refused(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    (only,) = arrange(owner_engine, flow, 1)
    bulk_id = _start(api, flow)
    inside, release = threading.Event(), threading.Event()

    def hold_the_item_open(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        # The item's cancel has written; its locks are held until the outcome commits.
        if statement.lstrip().startswith("UPDATE bulk_item"):
            inside.set()
            assert release.wait(20)

    event.listen(runtime_engine, "before_cursor_execute", hold_the_item_open)
    bulk_thread = threading.Thread(
        target=act_on_chunk,
        args=(runtime_engine, BulkWalk()),
        kwargs={"claims_budget": 10, "chunk_items": 5},
    )
    bulk_thread.start()
    answers: dict[str, Any] = {}

    def cancel() -> None:
        response = api.post(f"/executions/{only}/cancel", {"reason": "by hand"}, **OPERATOR)
        answers["cancel"] = (response.status_code, response.get_json()["code"])

    try:
        assert inside.wait(20)
        # A claim skips the row the bulk holds.
        with runtime_engine.connect() as conn:
            assert claim_round(conn, "w", limit=5, lease_seconds=30).claims == []
        operator = threading.Thread(target=cancel)
        operator.start()
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the cancel to queue")
    finally:
        release.set()
        bulk_thread.join(20)
        event.remove(runtime_engine, "before_cursor_execute", hold_the_item_open)
    operator.join(20)

    assert answers == {"cancel": (409, "NOT_CANCELLABLE")}
    (row,) = audits(owner_engine, "EXECUTION_CANCELLED")[only]
    assert row.detail["bulkId"] == bulk_id
    assert _progress(api, bulk_id)["succeeded"] == 1


def test_an_item_a_claim_holds_waits_for_it_and_is_requested_not_forced(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    (only,) = arrange(owner_engine, flow, 1)
    with owner_engine.begin() as conn:  # due now: a worker may claim it
        conn.execute(
            text("UPDATE execution SET next_attempt_at = now() WHERE id = :id"), {"id": only}
        )
    bulk_id = _start(api, flow)
    claimer = runtime_engine.connect()
    claiming = claimer.begin()
    claimed = claimer.execute(_CLAIM, {"limit": 1, "owner": "w", "lease_seconds": 30.0}).all()
    assert [row.id for row in claimed] == [only]
    bulk_thread = threading.Thread(target=_run_to_end, args=(runtime_engine,))
    bulk_thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the bulk's item to queue")
    finally:
        claiming.commit()
        claimer.close()
    bulk_thread.join(20)

    shown = _progress(api, bulk_id)
    # It found the claim's RUNNING: the cancel is recorded for the holder, the call not cut.
    assert shown["status"] == "DONE" and shown["succeeded"] == 1 and shown["refused"] == []
    assert shown["cancelRequested"] == [str(only)]
    assert statuses(owner_engine, [only]) == {only: "RUNNING"}


def test_a_bulk_retry_refuses_an_execution_that_parked_again_after_another_decision(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    # A bulk retry is accepted over two parked executions. Before it reaches the first,
    # another operator retries that one alone: the charge is made now, its answer is lost
    # and it parks again. That new doubt is not what the bulk's operator saw: deciding it
    # would charge a second time.
    flow = publish(owner_engine)
    changed, unchanged = parked(owner_engine, flow, 2)
    body = {"filter": {"flowId": str(flow)}, "action": "retry", "reason": "no charge made"}
    response = api.post("/executions/bulk", body, **OPERATOR)
    assert response.status_code == 202, response.get_data(as_text=True)
    bulk_id = response.get_json()["bulkId"]

    alone = api.post(
        f"/executions/{changed}/reconciliation",
        {"decision": "retry", "actionId": STEP, "reason": "looked at it myself"},
        **{**OPERATOR, "sub": "dave"},
    )
    assert alone.status_code == 200, alone.get_data(as_text=True)
    charge = RecordingAdapter(
        "test.charge", Effect.NON_IDEMPOTENT_WRITE, output=scripted(UncertainError("reset"))
    )
    registry = AdapterRegistry()
    registry.add(charge.adapter())
    executor = Executor(registry, settings(), WorkerHooks())
    assert run_once(runtime_engine, executor) == "RECONCILIATION_REQUIRED"
    assert len(charge.calls) == 1

    _run_to_end(runtime_engine)

    shown = _progress(api, bulk_id)
    assert (shown["status"], shown["done"], shown["succeeded"]) == ("DONE", 2, 1)
    (refused,) = shown["refused"]
    assert (refused["executionId"], refused["code"]) == (str(changed), "STALE_ITEM")
    assert "changed after the bulk was accepted" in refused["detail"]
    # The new doubt waits for a person; the execution nobody touched was retried.
    assert statuses(owner_engine, [changed, unchanged]) == {
        changed: "RECONCILIATION_REQUIRED",
        unchanged: "PENDING",
    }
    decided = audits(owner_engine, "RECONCILIATION_RESOLVED")
    assert [row.actor for row in decided[changed]] == ["dave"]
