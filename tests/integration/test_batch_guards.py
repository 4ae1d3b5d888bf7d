"""The batch function's guards one by one (the protocol writer's path): each row checked
and answered by (execution id, token) under its own fence, written whole or not at all.

`tests/mutations/guards.py` names, for every guard, the mutation that removes it; these
tests are the ones that catch what no other test did.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from orquestador.errors import ContractMismatch, LeaseLost, RequestChanged
from orquestador.queue import (
    ActionAttempt,
    CheckpointOutcome,
    Claim,
    Finish,
    end_attempt,
    start_checkpoint,
)
from orquestador.queue.batches import FinishRow, RidingSuccess, Row, RowBusy, StartRow, write_rows
from orquestador.worker.executor import Executor
from orquestador.worker.listener import libpq_conninfo
from orquestador.worker.protocol_writer import ProtocolWriter
from tests.integration.worker_support import (
    action,
    attempt_history,
    attempt_of,
    claim_one,
    expire_lease,
    flow_definition,
    publish_flow,
    registry_of,
    request_row,
    settings,
    start_execution,
)

TABLES = ("execution", "request", "action_execution", "action_attempt", "audit_event")


def _everything(engine: Engine) -> list[list[Any]]:
    with engine.connect() as conn:
        return [
            conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2")).all() for table in TABLES
        ]


def _write(engine: Engine, rows: Sequence[Row]) -> list[Any]:
    """One batch, as the writer sends it: one statement on an autocommit connection."""
    with psycopg.connect(libpq_conninfo(engine.url), autocommit=True) as conn:
        return write_rows(conn, rows)


def _started(engine: Engine, owner: str = "w1", effect: str = "IDEMPOTENT_WRITE") -> Claim:
    """An execution claimed by `owner`, its action "a" RUNNING under that claim."""
    start_execution(engine, flow_definition([action("a", "test.write")]))
    claim = claim_one(engine, owner)
    [answer] = _write(engine, [StartRow(claim, attempt_of(claim, effect=effect))])
    assert isinstance(answer, datetime)
    return claim


def _reclaimed(engine: Engine, old: Claim, owner: str) -> Claim:
    expire_lease(engine, old.execution_id)
    new = claim_one(engine, owner)
    assert (new.execution_id, new.token) == (old.execution_id, old.token + 1)
    return new


def _succeed(claim: Claim, action_id: str = "a", output: Any = None) -> RidingSuccess:
    return RidingSuccess(
        claim, action_id, output or {"by": claim.owner, "token": claim.token}, None
    )


def _finish(action_ids: Sequence[str] = ("a",)) -> Finish:
    return Finish("done", "DONE", None, [], list(action_ids), {"finished": True})


def _checkpoint(engine: Engine, claim: Claim, action_id: str = "a") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("""SELECT status, fencing_token, output FROM action_execution
                    WHERE execution_id = :id AND action_id = :action"""),
            {"id": claim.execution_id, "action": action_id},
        ).first()


# --- the fence of every row ------------------------------------------------------------


def _bad_claim(engine: Engine, how: str) -> Claim:
    """A claim whose fence fails one way, its action "a" RUNNING under it."""
    claim = _started(engine)
    if how == "expired lease":
        expire_lease(engine, claim.execution_id)
    elif how == "other owner":
        claim = replace(claim, owner="w2")  # the right token and a live lease
    else:  # its own worker took the execution back: same owner, a newer token
        _reclaimed(engine, claim, claim.owner)
    return claim


FENCE_FAILURES = ["expired lease", "other owner", "stale token"]


@pytest.mark.parametrize("how", FENCE_FAILURES)
def test_a_row_that_fails_its_fence_is_refused_and_its_neighbours_commit(runtime_engine, how):
    good = _started(runtime_engine)  # first: a claim takes an expired row before a new one
    bad = _bad_claim(runtime_engine, how)
    bad_before = _checkpoint(runtime_engine, bad)
    answers = _write(runtime_engine, [_succeed(bad), _succeed(good)])
    # One row, one answer, in the same transaction: no failed batch to split.
    assert isinstance(answers[0], LeaseLost) and answers[1] is None
    assert _checkpoint(runtime_engine, bad) == bad_before
    assert _checkpoint(runtime_engine, good).status == "SUCCEEDED"


@pytest.mark.parametrize("how", FENCE_FAILURES)
def test_a_row_that_fails_its_fence_is_refused_not_busy_while_another_session_holds_it(
    runtime_engine, owner_engine, how
):
    bad = _bad_claim(runtime_engine, how)
    before = _everything(runtime_engine)
    with owner_engine.connect() as stranger, stranger.begin():
        stranger.execute(
            text("SELECT 1 FROM execution WHERE id = :id FOR UPDATE"), {"id": bad.execution_id}
        )
        [answer] = _write(runtime_engine, [_succeed(bad)])
    # Busy would have the writer try it again and again until the lock timeout; a row
    # that fails its fence is refused at once, whoever holds the lock.
    assert isinstance(answer, LeaseLost), answer
    assert _everything(runtime_engine) == before


def test_a_stale_row_is_refused_even_batched_with_the_current_holders(runtime_engine):
    old = _started(runtime_engine)
    new = _reclaimed(runtime_engine, old, "w2")
    with runtime_engine.connect() as conn:
        start_checkpoint(conn, new, attempt_of(new, "b"))
    answers = _write(runtime_engine, [_succeed(old, "a"), _succeed(new, "b")])
    # Checked and answered by (execution id, token), never by execution id alone.
    assert isinstance(answers[0], LeaseLost) and answers[1] is None
    assert tuple(_checkpoint(runtime_engine, old, "a"))[:2] == ("RUNNING", old.token)
    assert _checkpoint(runtime_engine, new, "b").status == "SUCCEEDED"


# --- a riding success --------------------------------------------------------------------


RIDERS: dict[str, Callable[[Claim], Row]] = {
    "start": lambda c: StartRow(c, attempt_of(c, "b"), succeed=(_succeed(c, "a"),)),
    "finish": lambda c: FinishRow(c, _finish(()), succeed=(_succeed(c, "a"),)),
}


@pytest.mark.parametrize("rider", sorted(RIDERS))
def test_a_row_whose_riding_success_is_refused_writes_nothing_else(runtime_engine, rider):
    # Action "a" was never started by this holder, so its success cannot be recorded;
    # the write it rides in must not go ahead without it.
    start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    claim = claim_one(runtime_engine)
    before = _everything(runtime_engine)
    [answer] = _write(runtime_engine, [RIDERS[rider](claim)])
    assert isinstance(answer, LeaseLost)
    assert _everything(runtime_engine) == before


# --- SUCCEEDED checkpoints ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["succeeded", "left running"])
def test_a_batch_success_is_recorded_only_on_this_holders_running_checkpoint(runtime_engine, case):
    claim = _started(runtime_engine)
    if case == "succeeded":
        assert _write(runtime_engine, [_succeed(claim, output={"n": 1})]) == [None]
    else:  # the previous holder's attempt, never started again by this one
        claim = _reclaimed(runtime_engine, claim, "w2")
    before = _everything(runtime_engine)
    [answer] = _write(runtime_engine, [_succeed(claim, output={"n": 2})])
    assert isinstance(answer, LeaseLost)
    assert _everything(runtime_engine) == before


# --- RUNNING checkpoints -----------------------------------------------------------------


def _end(claim: Claim, status: str, code: str) -> Callable[[Engine], None]:
    def end(engine: Engine) -> None:
        with engine.connect() as conn:
            end_attempt(conn, claim, CheckpointOutcome("a", status, code))

    return end


def _prepare_refused_start(engine: Engine, case: str) -> tuple[Claim, ActionAttempt]:
    effect = "NON_IDEMPOTENT_WRITE" if "payment" in case else "IDEMPOTENT_WRITE"
    old = _started(engine, effect=effect)
    if case == "succeeded":
        assert _write(engine, [_succeed(old)]) == [None]
    elif case == "another key":
        _end(old, "FAILED", "TRANSIENT")(engine)
    elif case == "uncertain payment":
        _end(old, "UNKNOWN", "UNCERTAIN")(engine)
    new = _reclaimed(engine, old, "w2")
    attempt = attempt_of(new, attempt=2, effect=effect)
    if case == "another key":
        attempt = replace(attempt, external_key="another-key")
    return new, attempt


@pytest.mark.parametrize(
    "case", ["another key", "interrupted payment", "succeeded", "uncertain payment"]
)
def test_a_batch_start_never_replaces_a_checkpoint_it_may_not(runtime_engine, case):
    new, attempt = _prepare_refused_start(runtime_engine, case)
    before = _everything(runtime_engine)
    [answer] = _write(runtime_engine, [StartRow(new, attempt)])
    assert isinstance(answer, ContractMismatch), answer
    # Refused as a whole: no replaced attempt's line in the history either.
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize(
    ("effect", "recorded"), [("READ_ONLY", "FAILED"), ("IDEMPOTENT_WRITE", "UNKNOWN")]
)
def test_an_interrupted_attempt_started_again_in_a_batch_is_recorded_by_its_effect(
    runtime_engine, effect, recorded
):
    old = _started(runtime_engine, effect=effect)
    new = _reclaimed(runtime_engine, old, "w2")
    [answer] = _write(runtime_engine, [StartRow(new, attempt_of(new, attempt=2, effect=effect))])
    assert isinstance(answer, datetime)
    rows = attempt_history(runtime_engine, new.execution_id, "a")
    assert [(r.attempt, r.status, r.error_code) for r in rows] == [(1, recorded, "INTERRUPTED")]


# --- finishes ----------------------------------------------------------------------------


def _change_request(engine: Engine, claim: Claim, change: str) -> None:
    values: dict[str, Any] = {"id": claim.request_id}
    if change == "flow":
        # Pinned to another published flow since acceptance.
        values["flow"] = publish_flow(engine, flow_definition([action("a", "test.write")]))
    assignment = {
        "flow": "flow_id = :flow",
        "state": "state = 'other'",
        "revision": "revision = revision + 1",
        "released": "busy_execution_id = NULL",
    }[change]
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE request SET {assignment} WHERE id = :id"), values)


@pytest.mark.parametrize("change", ["flow", "released", "revision", "state"])
def test_a_batch_finish_is_refused_when_the_request_changed(runtime_engine, owner_engine, change):
    claim = _started(runtime_engine)
    assert _write(runtime_engine, [_succeed(claim)]) == [None]
    _change_request(owner_engine, claim, change)
    before = _everything(runtime_engine)
    [answer] = _write(runtime_engine, [FinishRow(claim, _finish())])
    assert isinstance(answer, RequestChanged), answer
    assert _everything(runtime_engine) == before


def test_a_batch_finish_is_refused_while_a_checkpoint_is_not_succeeded(runtime_engine):
    claim = _started(runtime_engine)
    before = _everything(runtime_engine)
    [answer] = _write(runtime_engine, [FinishRow(claim, _finish())])
    assert isinstance(answer, ContractMismatch), answer
    assert _everything(runtime_engine) == before


def _slow_audit_until(owner_engine: Engine, moment: datetime) -> None:
    """Make the batch's TRANSITION_COMPLETED insert take until `moment` (database time):
    a batch that works past a lease, with every lock already taken."""
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                f"""
                CREATE FUNCTION test_slow_audit() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    WHILE clock_timestamp() <= '{moment.isoformat()}'::timestamptz LOOP
                        PERFORM pg_sleep(0.01);
                    END LOOP;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER test_slow_audit BEFORE INSERT ON audit_event
                FOR EACH ROW WHEN (NEW.kind = 'TRANSITION_COMPLETED')
                EXECUTE FUNCTION test_slow_audit();
                """
            )
        )


def test_a_finish_whose_lease_runs_out_inside_the_batch_is_refused(runtime_engine, owner_engine):
    # The finish clears the lease it wrote under, so only the lease as it was locked
    # can tell that it ran out before COMMIT.
    claim = _started(runtime_engine)
    assert _write(runtime_engine, [_succeed(claim)]) == [None]
    with runtime_engine.begin() as conn:
        lease = conn.execute(
            text("""UPDATE execution SET lease_expires_at = clock_timestamp() + interval '1 s'
                    WHERE id = :id RETURNING lease_expires_at"""),
            {"id": claim.execution_id},
        ).scalar_one()
    _slow_audit_until(owner_engine, lease)
    before = _everything(runtime_engine)
    writer = ProtocolWriter(libpq_conninfo(runtime_engine.url), runtime_engine.dialect)
    try:
        with pytest.raises(LeaseLost):
            writer.finish(claim, _finish())
    finally:
        writer.close()
    assert _everything(runtime_engine) == before
    assert request_row(runtime_engine, claim.request_id).busy_execution_id == claim.execution_id


# --- bounded waits of the writer ---------------------------------------------------------


def _slow_success(owner_engine: Engine) -> None:
    """Make recording a SUCCEEDED checkpoint a statement that runs long (a trigger that
    sleeps), as a stalled disk or a huge row would."""
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                """
                CREATE FUNCTION test_slow_success() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM pg_sleep(20);
                    RETURN NEW;
                END $$;
                CREATE TRIGGER test_slow_success BEFORE UPDATE ON action_execution
                FOR EACH ROW WHEN (NEW.status = 'SUCCEEDED') EXECUTE FUNCTION test_slow_success();
                """
            )
        )


def test_a_writer_statement_is_cut_at_its_statement_timeout(runtime_engine, owner_engine):
    # A statement that runs long fails that row in bounded time instead of holding the
    # writer, and every job behind it, for as long as it runs.
    claim = _started(runtime_engine)
    _slow_success(owner_engine)
    writer = ProtocolWriter(
        libpq_conninfo(runtime_engine.url),
        runtime_engine.dialect,
        statement_timeout_ms=300,
        answer_seconds=10,  # without the timeout, the job would hear WriterStalled
    )
    try:
        with pytest.raises(Exception) as raised:
            writer.succeed(claim, "a", {"ok": True}, None)
    finally:
        writer.close()
    assert "statement timeout" in str(raised.value), raised.value
    assert _checkpoint(runtime_engine, claim).status == "RUNNING"


def _executor(**overrides: Any) -> Executor:
    return Executor(registry_of(), settings(**overrides))


def test_the_workers_writer_cuts_a_statement_within_the_lease(runtime_engine, owner_engine):
    # WORKER_STATEMENT_TIMEOUT_MS asks for 10 s; a quarter of an 8 s lease is the bound.
    claim = _started(runtime_engine)
    _slow_success(owner_engine)
    executor = _executor(
        worker_lease_seconds=8, worker_renew_seconds=2, worker_statement_timeout_ms=10_000
    )
    writer = executor.writer(runtime_engine)
    try:
        with pytest.raises(Exception) as raised:
            writer.succeed(claim, "a", {"ok": True}, None)
    finally:
        executor.close()
    # Not WriterStalled (the job gives up waiting at half the lease): the statement was
    # cut at 2 s.
    assert "statement timeout" in str(raised.value), raised.value


def test_the_workers_writer_waits_for_a_lock_no_longer_than_configured(
    runtime_engine, owner_engine
):
    claim = _started(runtime_engine)
    executor = _executor(worker_lock_timeout_ms=100)
    writer = executor.writer(runtime_engine)
    try:
        with owner_engine.connect() as stranger, stranger.begin():
            stranger.execute(
                text("SELECT 1 FROM action_execution WHERE execution_id = :id FOR UPDATE"),
                {"id": claim.execution_id},
            )
            began = time.monotonic()
            with pytest.raises(Exception) as raised:
                writer.succeed(claim, "a", {"ok": True}, None)
            waited = time.monotonic() - began
    finally:
        executor.close()
    assert "lock timeout" in str(raised.value), raised.value
    # 100 ms asked for; the writer's own default would have been 2 s.
    assert waited < 1.0, waited


def test_a_writer_statement_waits_for_a_lock_no_longer_than_its_lock_timeout(
    runtime_engine, owner_engine
):
    claim = _started(runtime_engine)
    writer = ProtocolWriter(
        libpq_conninfo(runtime_engine.url),
        runtime_engine.dialect,
        lock_timeout_ms=300,
        answer_seconds=10,  # without the timeout, the job would hear WriterStalled
    )
    try:
        with owner_engine.connect() as stranger, stranger.begin():
            # The checkpoint row is not among what the batch locks with SKIP LOCKED.
            stranger.execute(
                text("SELECT 1 FROM action_execution WHERE execution_id = :id FOR UPDATE"),
                {"id": claim.execution_id},
            )
            with pytest.raises(Exception) as raised:
                writer.succeed(claim, "a", {"ok": True}, None)
    finally:
        writer.close()
    assert not isinstance(raised.value, RowBusy)
    assert "lock timeout" in str(raised.value), raised.value
    assert _checkpoint(runtime_engine, claim).status == "RUNNING"
