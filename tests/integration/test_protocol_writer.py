"""The protocol writer: many jobs' rows in one transaction, each row answered on its own."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from orquestador.errors import LeaseLost, RequestChanged
from orquestador.queue import ActionAttempt, Claim, Finish, claim_round
from orquestador.queue.batches import RidingSuccess, RowBusy
from orquestador.worker.executor import Executor
from orquestador.worker.listener import libpq_conninfo
from orquestador.worker.protocol_writer import ProtocolWriter
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    attempt_history,
    audit,
    checkpoints,
    execution,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
    wait_until,
)


def _writer(engine) -> ProtocolWriter:
    return ProtocolWriter(libpq_conninfo(engine.url), engine.dialect, idle_seconds=1.0)


def _claims(engine, count: int) -> list[Claim]:
    for _ in range(count):
        start_execution(engine, flow_definition([action("a", "test.write")]), {"n": 1})
    with engine.connect() as conn:
        claims = claim_round(conn, "w1", limit=count, lease_seconds=30).claims
    assert len(claims) == count
    return claims


def _attempt(claim: Claim, effect: str = "IDEMPOTENT_WRITE") -> ActionAttempt:
    return ActionAttempt(
        action_id="a",
        attempt=1,
        input_hash="h",
        external_key=f"{claim.execution_id}:a",
        effect=effect,
        capability="test.write",
        adapter_version=1,
    )


def _finish(data: dict[str, Any]) -> Finish:
    return Finish(
        to_state="done", outcome=None, hit_policy=None, rule_ids=[], action_ids=["a"], data=data
    )


def _xmin(engine, table: str, execution_id: uuid.UUID) -> int:
    # The id of the transaction that wrote the row last.
    with engine.connect() as conn:
        return conn.execute(
            text(f"SELECT xmin::text::bigint FROM {table} WHERE execution_id = :id"),
            {"id": execution_id},
        ).scalar_one()


def _in_one_batch(writer: ProtocolWriter, calls: list[Any]) -> list[Future[Any]]:
    """Run `calls` (each a job's write) so that the writer takes them as one batch.

    A first write holds the writer inside its own batch until every call is queued.
    """
    entered = threading.Event()
    batches: list[int] = []

    def before(rows: list[Any]) -> None:
        batches.append(len(rows))
        if len(batches) == 1:
            entered.set()
            wait_until(lambda: writer.queued() >= len(calls) - 1, what="rows queued")

    writer.before_batch = before
    pool = ThreadPoolExecutor(max_workers=len(calls))
    try:
        plug = pool.submit(calls[0])
        entered.wait(10)
        futures = [pool.submit(call) for call in calls[1:]]
        plug.result(10)
        for future in futures:
            future.exception(10)
    finally:
        pool.shutdown(wait=True)
        writer.before_batch = None
    assert batches[:2] == [1, len(calls) - 1]
    return futures


def test_several_jobs_running_checkpoints_commit_in_one_transaction(runtime_engine):
    plug, *claims = _claims(runtime_engine, 4)
    writer = _writer(runtime_engine)
    calls = [lambda c=c: writer.start(c, _attempt(c)) for c in (plug, *claims)]
    futures = _in_one_batch(writer, calls)
    assert all(future.result() is not None for future in futures)
    xmins = {_xmin(runtime_engine, "action_execution", c.execution_id) for c in claims}
    assert len(xmins) == 1  # one transaction wrote all three
    assert _xmin(runtime_engine, "action_execution", plug.execution_id) not in xmins
    for claim in claims:
        assert checkpoints(runtime_engine, claim.execution_id)["a"].status == "RUNNING"
    assert writer.stats.batches == 2 and writer.stats.rows == 4
    writer.close()


def test_a_fenced_out_row_is_lease_lost_for_its_job_only(runtime_engine):
    plug, first, stale, last = _claims(runtime_engine, 4)
    writer = _writer(runtime_engine)
    for claim in (plug, first, stale, last):
        writer.start(claim, _attempt(claim))
    # Another worker reclaimed one of them: its token moved on.
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET fencing_token = fencing_token + 1 WHERE id = :id"),
            {"id": stale.execution_id},
        )
    calls = [
        lambda c=c: writer.succeed(c, "a", {"done": str(c.execution_id)}, None)
        for c in (plug, first, stale, last)
    ]
    done_first, done_stale, done_last = _in_one_batch(writer, calls)
    assert isinstance(done_stale.exception(), LeaseLost)
    assert done_first.result() is None and done_last.result() is None
    assert checkpoints(runtime_engine, stale.execution_id)["a"].status == "RUNNING"
    for claim in (first, last):
        row = checkpoints(runtime_engine, claim.execution_id)["a"]
        assert (row.status, row.output) == ("SUCCEEDED", {"done": str(claim.execution_id)})
    assert _xmin(runtime_engine, "action_execution", first.execution_id) == _xmin(
        runtime_engine, "action_execution", last.execution_id
    )
    writer.close()


def test_a_row_that_breaks_a_constraint_fails_alone_and_its_neighbours_commit(runtime_engine):
    plug, first, bad, last = _claims(runtime_engine, 4)
    writer = _writer(runtime_engine)
    calls = [
        lambda c=c: writer.start(c, _attempt(c, "BOGUS" if c is bad else "IDEMPOTENT_WRITE"))
        for c in (plug, first, bad, last)
    ]
    done_first, done_bad, done_last = _in_one_batch(writer, calls)
    assert isinstance(done_bad.exception(), IntegrityError)
    assert done_first.result() is not None and done_last.result() is not None
    assert "a" not in checkpoints(runtime_engine, bad.execution_id)
    for claim in (first, last):
        assert checkpoints(runtime_engine, claim.execution_id)["a"].status == "RUNNING"
    assert writer.stats.splits >= 1
    writer.close()


def test_two_finishes_in_one_batch_each_keep_their_own_atomicity(runtime_engine):
    plug, kept, changed = _claims(runtime_engine, 3)
    accepted = request_row(runtime_engine, kept.request_id).revision
    writer = _writer(runtime_engine)
    for claim in (plug, kept, changed):
        writer.start(claim, _attempt(claim))
        writer.succeed(claim, "a", {"ok": True}, None)
    # An operator moved one request since acceptance.
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE request SET revision = revision + 1, state = 'other' WHERE id = :id"),
            {"id": changed.request_id},
        )
    calls = [
        lambda c=c: writer.finish(c, _finish({"n": 2, "by": str(c.execution_id)}))
        for c in (plug, kept, changed)
    ]
    done_kept, done_changed = _in_one_batch(writer, calls)
    assert done_kept.result() is None
    assert isinstance(done_changed.exception(), RequestChanged)

    row = execution(runtime_engine, kept.execution_id)
    assert (row.status, row.lease_owner) == ("SUCCEEDED", None)
    request = request_row(runtime_engine, kept.request_id)
    assert (request.state, request.revision, request.busy_execution_id) == (
        "done",
        accepted + 1,
        None,
    )
    assert request.data == {"n": 2, "by": str(kept.execution_id)}
    (completed,) = audit(runtime_engine, kept.execution_id, "TRANSITION_COMPLETED")
    assert completed.detail["revision"] == accepted + 1

    # The refused one: nothing of its finish, everything as the operator left it.
    row = execution(runtime_engine, changed.execution_id)
    assert (row.status, row.result) == ("RUNNING", None)
    request = request_row(runtime_engine, changed.request_id)
    assert (request.state, request.revision) == ("other", accepted + 1)
    assert request.busy_execution_id == changed.execution_id and request.data == {"n": 1}
    assert not audit(runtime_engine, changed.execution_id, "TRANSITION_COMPLETED")
    writer.close()


def test_a_finish_whose_seam_raises_fails_alone(runtime_engine):
    plug, kept, failing = _claims(runtime_engine, 3)
    accepted = request_row(runtime_engine, failing.request_id).revision
    writer = _writer(runtime_engine)
    for claim in (plug, kept, failing):
        writer.start(claim, _attempt(claim))
        writer.succeed(claim, "a", {"ok": True}, None)

    def explode() -> None:
        raise RuntimeError("injected before commit")

    calls = [
        lambda c=c: writer.finish(c, _finish({}), explode if c is failing else None)
        for c in (plug, kept, failing)
    ]
    done_kept, done_failing = _in_one_batch(writer, calls)
    assert done_kept.result() is None
    with pytest.raises(RuntimeError):
        done_failing.result()
    assert execution(runtime_engine, kept.execution_id).status == "SUCCEEDED"
    assert execution(runtime_engine, failing.execution_id).status == "RUNNING"
    assert request_row(runtime_engine, failing.request_id).revision == accepted
    assert not audit(runtime_engine, failing.execution_id, "TRANSITION_COMPLETED")
    writer.close()


def test_a_lone_job_is_written_at_once_without_waiting_for_company(runtime_engine):
    write = Double("test.write")
    executor = Executor(registry_of(write), settings())
    start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    stats = executor.writer_stats()
    # The finish, with the step's whole attempt riding in it (a safe step writes no
    # RUNNING checkpoint): one row, its own transaction, written as soon as it arrived
    # (no bounded wait taken: no other job was running).
    assert (stats.rows, stats.batches, stats.gather_waits) == (1, 1, 0)
    executor.close()


def test_concurrent_jobs_share_transactions_and_all_succeed(runtime_engine):
    # Ten jobs at once through one executor: every execution ends SUCCEEDED with its
    # audit row, and the writer needed fewer transactions than rows.
    gate = threading.Barrier(10, timeout=10)

    def together(ctx):
        gate.wait()
        return {"ok": True}

    write = Double("test.write", output=together)
    executor = Executor(registry_of(write), settings(worker_concurrency=10))
    ids = [
        start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
        for _ in range(10)
    ]
    with runtime_engine.connect() as conn:
        claims = claim_round(conn, "w1", limit=10, lease_seconds=30).claims

    def run(claim: Claim) -> str:
        with runtime_engine.connect() as conn:
            return executor.run(conn, claim)

    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = list(pool.map(run, claims))
    assert statuses == ["SUCCEEDED"] * 10
    for execution_id in ids:
        assert len(audit(runtime_engine, execution_id, "TRANSITION_COMPLETED")) == 1
    stats = executor.writer_stats()
    assert stats.rows == 10 and stats.batches < 10
    executor.close()


def test_a_riding_checkpoint_stays_written_when_its_finish_is_refused(runtime_engine):
    (claim,) = _claims(runtime_engine, 1)
    writer = _writer(runtime_engine)
    writer.start(claim, _attempt(claim))
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE request SET revision = revision + 1, state = 'other' WHERE id = :id"),
            {"id": claim.request_id},
        )
    riding = RidingSuccess(claim, "a", {"ok": True}, None)
    with pytest.raises(RequestChanged):
        writer.finish(claim, _finish({"n": 2}), succeed=(riding,))
    # The transaction committed: the step's success is kept, the finish is not.
    row = checkpoints(runtime_engine, claim.execution_id)["a"]
    assert (row.status, row.output) == ("SUCCEEDED", {"ok": True})
    assert execution(runtime_engine, claim.execution_id).status == "RUNNING"
    writer.close()


def test_a_riding_checkpoint_is_rolled_back_with_its_failed_finish(runtime_engine):
    (claim,) = _claims(runtime_engine, 1)
    writer = _writer(runtime_engine)
    writer.start(claim, _attempt(claim))

    def explode() -> None:
        raise RuntimeError("injected before commit")

    riding = RidingSuccess(claim, "a", {"ok": True}, None)
    with pytest.raises(RuntimeError):
        writer.finish(claim, _finish({"n": 2}), explode, succeed=(riding,))
    # All or nothing: the job hears an error that is not a refusal and writes it alone.
    assert checkpoints(runtime_engine, claim.execution_id)["a"].status == "RUNNING"
    writer.succeed(claim, "a", {"ok": True}, None)
    writer.finish(claim, _finish({"n": 2}))
    assert execution(runtime_engine, claim.execution_id).status == "SUCCEEDED"
    writer.close()


def test_a_start_carries_the_previous_steps_success_and_a_stale_one_writes_neither(
    runtime_engine,
):
    kept, stale = _claims(runtime_engine, 2)
    writer = _writer(runtime_engine)
    for claim in (kept, stale):
        writer.start(claim, _attempt(claim))
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET fencing_token = fencing_token + 1 WHERE id = :id"),
            {"id": stale.execution_id},
        )
    for claim in (kept, stale):
        nxt = replace(_attempt(claim), action_id="b", external_key=f"{claim.execution_id}:b")
        riding = RidingSuccess(claim, "a", {"ok": True}, None)
        if claim is stale:
            with pytest.raises(LeaseLost):
                writer.start(claim, nxt, (riding,))
        else:
            writer.start(claim, nxt, (riding,))
    written = checkpoints(runtime_engine, kept.execution_id)
    assert (written["a"].status, written["b"].status) == ("SUCCEEDED", "RUNNING")
    refused = checkpoints(runtime_engine, stale.execution_id)
    assert refused["a"].status == "RUNNING" and "b" not in refused
    writer.close()


def _lease_runs_out_when_b_starts(owner_engine) -> None:
    """Make the lease of an execution run out at the moment its step b's RUNNING row is
    inserted, inside the batch: as if the clock passed the lease between two steps."""
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                """
                CREATE FUNCTION test_lease_runs_out() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    UPDATE execution SET lease_expires_at = clock_timestamp()
                    WHERE id = NEW.execution_id;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER test_lease_runs_out BEFORE INSERT ON action_execution
                FOR EACH ROW WHEN (NEW.action_id = 'b') EXECUTE FUNCTION test_lease_runs_out();
                """
            )
        )


def test_a_lease_running_out_mid_batch_leaves_no_part_of_the_row_written(
    runtime_engine, owner_engine
):
    # Regression: the batch function re-checked the lease step by step, so a lease that
    # ran out between the RUNNING and the riding SUCCEEDED committed b's RUNNING alone;
    # the next holder re-ran a and parked b, which was never called.
    (claim,) = _claims(runtime_engine, 1)
    writer = _writer(runtime_engine)
    writer.start(claim, _attempt(claim))
    _lease_runs_out_when_b_starts(owner_engine)
    nxt = replace(_attempt(claim), action_id="b", external_key=f"{claim.execution_id}:b")
    with pytest.raises(LeaseLost):
        writer.start(claim, nxt, (RidingSuccess(claim, "a", {"ok": True}, None),))
    written = checkpoints(runtime_engine, claim.execution_id)
    assert written["a"].status == "RUNNING" and "b" not in written
    assert [row.status for row in attempt_history(runtime_engine, claim.execution_id, "a")] == []
    writer.close()


def test_a_stale_holders_finish_batched_with_the_current_holders_is_refused(runtime_engine):
    # Regression: answers were keyed by execution id alone, so the stale holder of an
    # execution was told its finish succeeded because the current holder's did.
    plug, stale = _claims(runtime_engine, 2)
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET fencing_token = fencing_token + 1 WHERE id = :id"),
            {"id": stale.execution_id},
        )
    current = replace(stale, token=stale.token + 1)
    writer = _writer(runtime_engine)
    writer.start(current, _attempt(current))
    writer.succeed(current, "a", {"ok": True}, None)
    calls = [
        lambda: writer.start(plug, _attempt(plug)),
        lambda: writer.finish(stale, _finish({"by": "stale"})),
        lambda: writer.finish(current, _finish({"by": "current"})),
    ]
    done_stale, done_current = _in_one_batch(writer, calls)
    assert done_current.result() is None
    assert isinstance(done_stale.exception(), LeaseLost)
    assert request_row(runtime_engine, stale.request_id).data == {"by": "current"}
    writer.close()


def _stranger_locks(engine, sql: str, params: dict[str, Any]) -> tuple[Any, Any]:
    """Another session (an operator's open psql transaction) holding a row lock."""
    conn = engine.connect()
    transaction = conn.begin()
    assert conn.execute(text(sql), params).first() is not None
    return conn, transaction


def _finish_ready(writer: ProtocolWriter, claims: list[Claim]) -> None:
    for claim in claims:
        writer.start(claim, _attempt(claim))
        writer.succeed(claim, "a", {"ok": True}, None)


@pytest.mark.parametrize(
    "locked_row",
    [
        "SELECT 1 FROM request WHERE id = :request_id FOR UPDATE",
        "SELECT 1 FROM execution WHERE id = :execution_id FOR UPDATE",
    ],
    ids=["request", "execution"],
)
def test_a_row_another_session_holds_does_not_hold_back_the_others(runtime_engine, locked_row):
    # Regression: one locked row stalled the writer's batch, and with it every job.
    held, free = _claims(runtime_engine, 2)
    writer = ProtocolWriter(
        libpq_conninfo(runtime_engine.url), runtime_engine.dialect, busy_seconds=20
    )
    _finish_ready(writer, [held, free])
    conn, transaction = _stranger_locks(
        runtime_engine,
        locked_row,
        {"request_id": held.request_id, "execution_id": held.execution_id},
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        try:
            waiting = pool.submit(writer.finish, held, _finish({"by": "held"}))
            wait_until(lambda: writer.stats.busy_retries > 0, what="the held row found busy")
            writer.finish(free, _finish({"by": "free"}))  # answered while the lock is held
            assert execution(runtime_engine, free.execution_id).status == "SUCCEEDED"
            assert not waiting.done(), waiting.exception() if waiting.done() else None
        finally:
            transaction.rollback()
            conn.close()
        assert waiting.result(20) is None  # written once the stranger let go
    assert execution(runtime_engine, held.execution_id).status == "SUCCEEDED"
    assert request_row(runtime_engine, held.request_id).data == {"by": "held"}
    writer.close()


def test_a_row_locked_past_the_lock_timeout_is_given_up_and_writes_nothing(runtime_engine):
    (held,) = _claims(runtime_engine, 1)
    writer = ProtocolWriter(
        libpq_conninfo(runtime_engine.url), runtime_engine.dialect, busy_seconds=0.3
    )
    writer.start(held, _attempt(held))
    conn, transaction = _stranger_locks(
        runtime_engine,
        "SELECT 1 FROM request WHERE id = :request_id FOR UPDATE",
        {"request_id": held.request_id},
    )
    try:
        with pytest.raises(RowBusy):
            writer.finish(
                held, _finish({"n": 2}), succeed=(RidingSuccess(held, "a", {"ok": 1}, None),)
            )
    finally:
        transaction.rollback()
        conn.close()
    # Nothing of the row: the lease recovery that follows starts from what was there.
    assert checkpoints(runtime_engine, held.execution_id)["a"].status == "RUNNING"
    assert execution(runtime_engine, held.execution_id).status == "RUNNING"
    writer.close()


def test_a_writer_thread_that_ends_never_closes_the_next_threads_connection(runtime_engine):
    # Regression: an idle writer thread, ending, closed the writer's shared connection
    # after a new thread had started using it for the next row.
    first, second = _claims(runtime_engine, 2)
    writer = ProtocolWriter(
        libpq_conninfo(runtime_engine.url), runtime_engine.dialect, idle_seconds=0.05
    )
    ending: list[threading.Thread] = []
    ended_once = threading.Event()
    let_go = threading.Event()

    def before_disconnect() -> None:
        if not ending:
            ending.append(threading.current_thread())
            ended_once.set()
            let_go.wait(10)

    def before_batch(rows: list[Any]) -> None:
        if ending and threading.current_thread() is not ending[0]:
            let_go.set()  # the old thread closes its connection now, mid-batch of the new
            ending[0].join(10)

    writer.before_disconnect = before_disconnect
    writer.start(first, _attempt(first))
    assert ended_once.wait(10), "the idle writer thread never ended"
    writer.before_batch = before_batch
    writer.start(second, _attempt(second))  # a new thread, its own connection
    assert checkpoints(runtime_engine, second.execution_id)["a"].status == "RUNNING"
    writer.before_batch = None
    writer.succeed(second, "a", {"ok": True}, None)
    assert checkpoints(runtime_engine, second.execution_id)["a"].status == "SUCCEEDED"
    writer.close()


def test_a_riding_success_is_written_before_the_next_steps_running(runtime_engine):
    # Regression: the batch function wrote the next step's RUNNING before the riding
    # SUCCEEDED of the step before it, within the same transaction.
    (claim,) = _claims(runtime_engine, 1)
    writer = _writer(runtime_engine)
    writer.start(claim, _attempt(claim))
    nxt = replace(_attempt(claim), action_id="b", external_key=f"{claim.execution_id}:b")
    writer.start(claim, nxt, (RidingSuccess(claim, "a", {"ok": True}, None),))
    written = checkpoints(runtime_engine, claim.execution_id)
    assert (written["a"].status, written["b"].status) == ("SUCCEEDED", "RUNNING")
    # One transaction, and clock_timestamp() moves on within it: the order is visible.
    assert written["a"].finished_at <= written["b"].started_at
    writer.close()
