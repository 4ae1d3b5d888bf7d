"""The protocol's guards one by one: each test fails when its guard is removed.

`tests/mutations/guards.py` names, for every guard, the mutation that removes it and the
tests here (or elsewhere) that catch it; these are the ones no other test caught.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, pool, text

from orquestador.actions import Effect, UncertainError
from orquestador.errors import ContractMismatch, LeaseLost, RequestChanged
from orquestador.queue import (
    CheckpointOutcome,
    Claim,
    Finish,
    cancel,
    claim_round,
    end_attempt,
    exit_on_error,
    fail_execution,
    finish_execution,
    load_execution,
    record_found_write,
    release_lease,
    renew_leases,
    require_reconciliation,
    schedule_retry,
    start_checkpoint,
    succeed_checkpoint,
)
from orquestador.queue.claims import _CLAIM
from orquestador.queue.waits import park_waiting
from orquestador.worker.daemon import build_worker
from orquestador.worker.executor import Executor
from orquestador.worker.heartbeat import Heartbeat
from orquestador.worker.hooks import WorkerHooks
from orquestador.worker.leases import HeldLeases
from tests.integration.worker_support import (
    ORG,
    SimulatedCrash,
    action,
    attempt_history,
    attempt_of,
    checkpoints,
    claim_one,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    publish_flow,
    registry_of,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double

TABLES = ("execution", "request", "action_execution", "action_attempt", "audit_event")


def _everything(engine: Engine) -> list[list[Any]]:
    """Every row a holder write could touch, to prove a refused write changed nothing."""
    with engine.connect() as conn:
        return [
            conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2")).all() for table in TABLES
        ]


def _started(engine: Engine, owner: str = "w1", effect: str = "IDEMPOTENT_WRITE") -> Claim:
    """An execution claimed by `owner`, its action "a" RUNNING under that claim."""
    start_execution(engine, flow_definition([action("a", "test.write")]))
    claim = claim_one(engine, owner)
    with engine.connect() as conn:
        start_checkpoint(conn, claim, attempt_of(claim, effect=effect))
    return claim


def _reclaimed(engine: Engine, old: Claim, owner: str) -> Claim:
    expire_lease(engine, old.execution_id)
    new = claim_one(engine, owner)
    assert (new.execution_id, new.token) == (old.execution_id, old.token + 1)
    return new


def _in_transaction(conn: Connection, write: Callable[[], Any]) -> None:
    with conn.begin():
        write()


def _release_or_refuse(conn: Connection, claim: Claim) -> None:
    if not release_lease(conn, claim):
        raise LeaseLost()


# Every write a holder makes, as the holder `claim` would make it on action "a".
HOLDER_WRITES: dict[str, Callable[[Connection, Claim], Any]] = {
    "load": load_execution,
    "start_checkpoint": lambda conn, c: start_checkpoint(conn, c, attempt_of(c, attempt=2)),
    "succeed_checkpoint": lambda conn, c: succeed_checkpoint(conn, c, "a", {"late": True}),
    "write_attempt_outcome": lambda conn, c: end_attempt(
        conn, c, CheckpointOutcome("a", "UNKNOWN", "X")
    ),
    "schedule_retry": lambda conn, c: schedule_retry(
        conn, c, CheckpointOutcome("a", "FAILED", "TRANSIENT"), 1.0, 1
    ),
    "fail_execution": lambda conn, c: fail_execution(conn, c, "BOOM"),
    "require_reconciliation": lambda conn, c: require_reconciliation(conn, c, "WHY"),
    "exit_on_error": lambda conn, c: exit_on_error(
        conn, c, CheckpointOutcome("a", "FAILED", "NOPE"), "attention", ["a"]
    ),
    "park_waiting": lambda conn, c: park_waiting(conn, c, "a", 60.0, "k", None),
    "record_found_write": lambda conn, c: record_found_write(
        conn,
        c,
        action_id="a",
        external_key=f"{c.execution_id}:a",
        output={"found": True},
        actor="system:worker",
    ),
    "finish_execution": lambda conn, c: finish_execution(
        conn, c, Finish("done", "DONE", None, [], [], {"late": True})
    ),
    "release_lease": _release_or_refuse,
}


# --- the fence: owner and token ----------------------------------------------------------


@pytest.mark.parametrize("write", sorted(HOLDER_WRITES))
def test_a_holder_reclaimed_by_its_own_worker_can_no_longer_write(runtime_engine, write):
    # The same worker takes its own expired execution back (a job that hung past its
    # lease): same owner name, a new token. Only the token tells the two jobs apart.
    old = _started(runtime_engine, "w1")
    _reclaimed(runtime_engine, old, "w1")
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        HOLDER_WRITES[write](conn, old)
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("write", sorted(HOLDER_WRITES))
def test_a_claim_under_another_owners_name_writes_nothing(runtime_engine, write):
    claim = _started(runtime_engine, "w1")
    intruder = replace(claim, owner="w2")  # the right token, a live lease, another owner
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        HOLDER_WRITES[write](conn, intruder)
    assert _everything(runtime_engine) == before


def test_a_stale_finish_is_refused_for_its_lease_first(runtime_engine):
    # Refused for its lease, not for the checkpoint it never finished: a stale holder
    # must learn it lost the execution, not try to park it for a contract problem.
    old = _started(runtime_engine)
    _reclaimed(runtime_engine, old, "w2")
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        finish_execution(conn, old, Finish("done", "DONE", None, [], ["a"], {}))
    assert _everything(runtime_engine) == before


# --- leases: renewal, and a lease that runs out while a write waits ------------------------


def test_a_renewal_under_a_stale_token_extends_nothing(runtime_engine):
    old = _started(runtime_engine, "w1")
    new = _reclaimed(runtime_engine, old, "w1")
    before = execution(runtime_engine, new.execution_id).lease_expires_at
    with runtime_engine.connect() as conn:
        renew_leases(conn, "w1", [(old.execution_id, old.token)], 600)
    # The new claim's lease is its own to renew: the old key must not extend it.
    assert execution(runtime_engine, new.execution_id).lease_expires_at == before


def test_a_renewal_under_another_owners_name_extends_nothing(runtime_engine):
    claim = _started(runtime_engine, "w1")
    before = execution(runtime_engine, claim.execution_id).lease_expires_at
    with runtime_engine.connect() as conn:
        renew_leases(conn, "w2", [(claim.execution_id, claim.token)], 600)
    assert execution(runtime_engine, claim.execution_id).lease_expires_at == before


def _waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return (
            conn.execute(
                text("""SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'""")
            ).scalar_one()
            > 0
        )


def _lease_over(engine: Engine, execution_id: uuid.UUID) -> bool:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT lease_expires_at < clock_timestamp() FROM execution WHERE id = :id"),
            {"id": execution_id},
        ).scalar_one()


ENDINGS: dict[str, Callable[[Connection, Claim], Any]] = {
    "fail": lambda conn, c: fail_execution(
        conn, c, "BOOM", attempt_outcome=CheckpointOutcome("a", "FAILED", "TRANSIENT")
    ),
    "retry": lambda conn, c: schedule_retry(
        conn, c, CheckpointOutcome("a", "FAILED", "TRANSIENT"), 1.0, 1
    ),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_lease_that_runs_out_inside_the_transaction_is_refused_before_commit(
    runtime_engine, owner_engine, ending
):
    claim = _started(runtime_engine, effect="READ_ONLY")
    eid = claim.execution_id
    with runtime_engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET lease_expires_at = clock_timestamp() + interval '3 s'
                    WHERE id = :id"""),
            {"id": eid},
        )
    before = _everything(runtime_engine)
    # A third session holds the checkpoint row: the transaction passes its fence, locks
    # the request and the execution, and then waits while the lease runs out.
    blocker = owner_engine.connect()
    blocking = blocker.begin()
    blocker.execute(
        text("SELECT 1 FROM action_execution WHERE execution_id = :id FOR UPDATE"), {"id": eid}
    )
    outcome: dict[str, BaseException | None] = {}

    def holder_ends() -> None:
        with runtime_engine.connect() as conn:
            try:
                ENDINGS[ending](conn, claim)
                outcome["error"] = None
            except BaseException as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=holder_ends)
    thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the transaction to wait")
        wait_until(lambda: _lease_over(owner_engine, eid), what="the lease to run out")
    finally:
        blocking.rollback()
        blocker.close()
        thread.join(20)
    assert isinstance(outcome["error"], LeaseLost)
    assert _everything(runtime_engine) == before


# The one-statement holder writes whose fence check must also lock the execution row.
IN_FLIGHT_WRITES: dict[str, tuple[str, Callable[[Connection, Claim], Any]]] = {
    "end_attempt": (
        "IDEMPOTENT_WRITE",
        lambda conn, c: end_attempt(conn, c, CheckpointOutcome("a", "FAILED", "TRANSIENT")),
    ),
    "park_waiting": ("READ_ONLY", lambda conn, c: park_waiting(conn, c, "a", 60.0, "k", None)),
    "record_found_write": (
        "NON_IDEMPOTENT_WRITE",
        lambda conn, c: record_found_write(
            conn,
            c,
            action_id="a",
            external_key=f"{c.execution_id}:a",
            output={"found": True},
            actor="system:worker",
        ),
    ),
}


@pytest.mark.parametrize("write", sorted(IN_FLIGHT_WRITES))
def test_a_holder_write_in_flight_keeps_a_reclaimer_out_until_it_commits(
    runtime_engine, owner_engine, write
):
    effect, holder_write = IN_FLIGHT_WRITES[write]
    claim = _started(runtime_engine, effect=effect)
    eid = claim.execution_id
    with runtime_engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET lease_expires_at = clock_timestamp() + interval '2 s'
                    WHERE id = :id"""),
            {"id": eid},
        )
    # A third session holds the checkpoint row: the write passes its fence, and then
    # waits inside its statement while the lease runs out.
    blocker = owner_engine.connect()
    blocking = blocker.begin()
    blocker.execute(
        text("SELECT 1 FROM action_execution WHERE execution_id = :id FOR UPDATE"), {"id": eid}
    )
    outcome: dict[str, BaseException | None] = {}

    def holder_writes() -> None:
        with runtime_engine.connect() as conn:
            try:
                holder_write(conn, claim)
                outcome["error"] = None
            except BaseException as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=holder_writes)
    thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(owner_engine), what="the write to be in flight")
        wait_until(lambda: _lease_over(owner_engine, eid), what="the lease to run out")
        with runtime_engine.connect() as conn:
            taken = claim_round(conn, "reclaimer", limit=1, lease_seconds=30).claims
        # The row lock the write took with its fence check keeps the reclaimer out.
        assert taken == []
    finally:
        blocking.rollback()
        blocker.close()
        thread.join(20)
    assert outcome == {"error": None}


def test_a_finish_whose_seam_ends_within_the_lease_commits(runtime_engine):
    # Regression: the re-check after the seam used the fence, which the finish's own
    # write had already ended, so every finish with a seam was refused.
    claim = _started(runtime_engine)
    with runtime_engine.connect() as conn:
        succeed_checkpoint(conn, claim, "a", {"ok": True})
    reached: list[bool] = []
    with runtime_engine.connect() as conn:
        finish_execution(
            conn,
            claim,
            Finish("done", "DONE", None, [], ["a"], {"moved": True}),
            before_commit=lambda: reached.append(True),
        )
    assert reached == [True]
    with runtime_engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT e.status, r.state, r.data, r.busy_execution_id FROM execution e"
                " JOIN request r ON r.id = e.request_id WHERE e.id = :id"
            ),
            {"id": claim.execution_id},
        ).one()
    assert tuple(row) == ("SUCCEEDED", "done", {"moved": True}, None)


def test_a_finish_whose_seam_outlasts_the_lease_is_rolled_back(runtime_engine, owner_engine):
    claim = _started(runtime_engine)
    eid = claim.execution_id
    with runtime_engine.connect() as conn:
        succeed_checkpoint(conn, claim, "a", {"ok": True})
    with runtime_engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET lease_expires_at = clock_timestamp() + interval '3 s'
                    WHERE id = :id"""),
            {"id": eid},
        )
    before = _everything(runtime_engine)
    reached: list[bool] = []

    def slow_commit() -> None:  # the finish holds its locks while the lease runs out
        reached.append(True)
        wait_until(lambda: _lease_over(owner_engine, eid), what="the lease to run out")

    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        finish_execution(
            conn, claim, Finish("done", "DONE", None, [], ["a"], {}), before_commit=slow_commit
        )
    assert reached == [True], "the finish was refused before its seam, not after it"
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("lease_seconds", [0.0, 30.0])
def test_a_heartbeat_that_cannot_renew_stops_its_jobs_once_the_lease_is_over(lease_seconds):
    # Nothing listens on port 1: every renewal fails at once.
    unreachable = create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:1/nothing", poolclass=pool.NullPool
    )
    leases = HeldLeases(lease_seconds)
    now = datetime.now(UTC)
    claim = Claim(uuid.uuid4(), 1, "w1", 1, 10, uuid.uuid4(), now, now, now)
    held = leases.add(claim)
    heartbeat = Heartbeat(unreachable, "w1", leases, lease_seconds, renew_seconds=1)
    try:
        heartbeat.beat()
    finally:
        unreachable.dispose()
    assert not heartbeat.healthy.is_set()
    # Trusting a lease nobody could renew for longer than the lease is what must stop.
    assert held.stop.is_set() is (lease_seconds == 0.0)


def test_a_job_whose_lease_was_not_renewed_is_told_to_stop(runtime_engine):
    claim = _started(runtime_engine, "w1")
    leases = HeldLeases(30)
    held = leases.add(claim)
    _reclaimed(runtime_engine, claim, "w2")
    Heartbeat(runtime_engine, "w1", leases, 30, renew_seconds=10).beat()
    assert held.stop.is_set() and held.lost


@pytest.mark.parametrize("lease_seconds", [0.0, 30.0])
def test_a_lease_another_session_keeps_locked_past_its_length_stops_its_job(
    runtime_engine, owner_engine, lease_seconds
):
    # A renewal skips a row someone else holds (busy: neither renewed nor lost); the
    # local bound still stops the job once its lease could have run out.
    claim = _started(runtime_engine, "w1")
    leases = HeldLeases(lease_seconds)
    held = leases.add(claim)
    with owner_engine.connect() as stranger, stranger.begin():
        stranger.execute(
            text("SELECT 1 FROM execution WHERE id = :id FOR UPDATE"), {"id": claim.execution_id}
        )
        Heartbeat(runtime_engine, "w1", leases, 30, renew_seconds=10).beat()
    assert held.stop.is_set() is (lease_seconds == 0.0)


# --- claims ---------------------------------------------------------------------------


def test_a_claim_skips_a_locked_expired_row_instead_of_waiting(runtime_engine):
    locked = _started(runtime_engine, "crashed")
    expire_lease(runtime_engine, locked.execution_id)
    with runtime_engine.connect() as holder:
        holder.begin()
        holder.execute(
            text("SELECT 1 FROM execution WHERE id = :id FOR UPDATE"),
            {"id": locked.execution_id},
        )
        with runtime_engine.connect() as conn:
            conn.execute(text("SET lock_timeout = '2s'"))
            conn.commit()
            claims = claim_round(conn, "w1", limit=10, lease_seconds=30).claims
        holder.rollback()
    assert claims == []


ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "RECONCILIATION_REQUIRED")


def test_an_execution_that_ended_or_is_parked_is_never_claimed(runtime_engine, owner_engine):
    for status in ENDED:
        eid = start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
        with owner_engine.begin() as conn:
            conn.execute(
                text("""UPDATE execution SET status = :status,
                            next_attempt_at = clock_timestamp() - interval '1 hour'
                        WHERE id = :id"""),
                {"id": eid, "status": status},
            )
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w1", limit=10, lease_seconds=30).claims == []


def test_a_lease_runs_from_the_moment_of_the_claim(runtime_engine):
    start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    with runtime_engine.connect() as conn, conn.begin():
        # A transaction whose start lies a second back: now() is frozen there, and the
        # lease must not be.
        a_second_later = text("SELECT clock_timestamp() > now() + interval '1 s'")
        wait_until(lambda: conn.execute(a_second_later).scalar(), what="a second to pass")
        row = conn.execute(_CLAIM, {"limit": 1, "owner": "w1", "lease_seconds": 30.0}).one()
    assert (row.lease_expires_at - row.claimed_at).total_seconds() > 29.5


# --- checkpoints --------------------------------------------------------------------------


def _succeeded(engine: Engine, claim: Claim) -> None:
    with engine.connect() as conn:
        succeed_checkpoint(conn, claim, "a", {"n": 1})


def _failed(engine: Engine, claim: Claim) -> None:
    with engine.connect() as conn:
        end_attempt(conn, claim, CheckpointOutcome("a", "FAILED", "TRANSIENT"))


def _uncertain(engine: Engine, claim: Claim) -> None:
    with engine.connect() as conn:
        end_attempt(conn, claim, CheckpointOutcome("a", "UNKNOWN", "UNCERTAIN"))


# (the effect of action "a", what became of its first attempt, the next attempt's key)
REFUSED_STARTS: dict[str, tuple[str, Callable[[Engine, Claim], Any], str | None]] = {
    "succeeded": ("IDEMPOTENT_WRITE", _succeeded, None),
    "another key": ("IDEMPOTENT_WRITE", _failed, "another-key"),
    "interrupted payment": ("NON_IDEMPOTENT_WRITE", lambda engine, claim: None, None),
    "uncertain payment": ("NON_IDEMPOTENT_WRITE", _uncertain, None),
}


@pytest.mark.parametrize("case", sorted(REFUSED_STARTS))
def test_a_start_never_replaces_a_checkpoint_it_may_not(runtime_engine, case):
    effect, first_attempt_ends, key = REFUSED_STARTS[case]
    old = _started(runtime_engine, effect=effect)
    first_attempt_ends(runtime_engine, old)
    new = _reclaimed(runtime_engine, old, "w2")
    attempt = attempt_of(new, attempt=2, effect=effect)
    if key:
        attempt = replace(attempt, external_key=key)
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(ContractMismatch):
        start_checkpoint(conn, new, attempt)
    # Refused as a whole: no replaced attempt's line in the history either.
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize(
    ("effect", "recorded"), [("READ_ONLY", "FAILED"), ("IDEMPOTENT_WRITE", "UNKNOWN")]
)
def test_an_interrupted_write_enters_the_history_as_in_doubt(runtime_engine, effect, recorded):
    old = _started(runtime_engine, effect=effect)
    new = _reclaimed(runtime_engine, old, "w2")
    with runtime_engine.connect() as conn:
        start_checkpoint(conn, new, attempt_of(new, attempt=2, effect=effect))
    rows = attempt_history(runtime_engine, new.execution_id, "a")
    assert [(r.attempt, r.status, r.error_code) for r in rows] == [(1, recorded, "INTERRUPTED")]


@pytest.mark.parametrize("case", ["succeeded", "left running"])
def test_only_this_holders_running_checkpoint_can_succeed(runtime_engine, case):
    claim = _started(runtime_engine)
    if case == "succeeded":
        _succeeded(runtime_engine, claim)
    else:  # the previous holder's attempt, never started again by this one
        claim = _reclaimed(runtime_engine, claim, "w2")
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        succeed_checkpoint(conn, claim, "a", {"n": 2})
    assert _everything(runtime_engine) == before


def test_an_attempt_that_ended_cannot_end_again(runtime_engine):
    claim = _started(runtime_engine)
    _succeeded(runtime_engine, claim)
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(ContractMismatch):
        end_attempt(conn, claim, CheckpointOutcome("a", "FAILED", "TRANSIENT"))
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("case", ["succeeded", "another key"])
def test_a_finding_is_recorded_only_on_a_write_in_doubt_under_its_key(runtime_engine, case):
    claim = _started(runtime_engine, effect="NON_IDEMPOTENT_WRITE")
    key = f"{claim.execution_id}:a"
    if case == "succeeded":
        _succeeded(runtime_engine, claim)
    else:
        key = "another-key"
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(ContractMismatch):
        record_found_write(
            conn,
            claim,
            action_id="a",
            external_key=key,
            output={"found": True},
            actor="system:worker",
        )
    assert _everything(runtime_engine) == before


# --- finishes, failures and error exits ------------------------------------------------


def _change_request(engine: Engine, request_id: uuid.UUID, change: str) -> None:
    if change == "flow":
        row = request_row(engine, request_id)
        with engine.connect() as conn:
            definition = conn.execute(
                text("SELECT definition FROM flow WHERE id = :id"), {"id": row.flow_id}
            ).scalar_one()
        # Another published flow: the request is pinned to it since acceptance.
        assignment = "flow_id = :flow"
        values: dict[str, Any] = {
            "flow": publish_flow(engine, {**definition, "key": f"flow-{uuid.uuid4().hex[:8]}"})
        }
    else:
        assignment, values = {
            "state": ("state = 'other'", {}),
            "revision": ("revision = revision + 1", {}),
            "released": ("busy_execution_id = NULL", {}),
        }[change]
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE request SET {assignment} WHERE id = :id"), {"id": request_id, **values}
        )


@pytest.mark.parametrize("change", ["flow", "state", "revision"])
def test_a_finish_is_refused_when_the_request_changed(runtime_engine, owner_engine, change):
    claim = _started(runtime_engine)
    _succeeded(runtime_engine, claim)
    _change_request(owner_engine, claim.request_id, change)
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(RequestChanged):
        finish_execution(conn, claim, Finish("done", "DONE", None, [], ["a"], {"moved": True}))
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("change", ["released", "state"])
def test_an_error_exit_is_refused_when_the_request_changed(runtime_engine, owner_engine, change):
    claim = _started(runtime_engine)
    _change_request(owner_engine, claim.request_id, change)
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(RequestChanged):
        exit_on_error(conn, claim, CheckpointOutcome("a", "FAILED", "NOPE"), "attention", ["a"])
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("change", ["flow", "state", "revision", "released"])
def test_a_request_changed_since_acceptance_is_refused_before_any_adapter(
    runtime_engine, owner_engine, change
):
    write = Double("test.write")
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    _change_request(owner_engine, execution(runtime_engine, eid).request_id, change)
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "FAILED"
    assert write.calls == []
    assert execution(runtime_engine, eid).error_code == "REQUEST_CHANGED"


def test_a_finish_is_refused_while_a_checkpoint_is_not_succeeded(runtime_engine):
    claim = _started(runtime_engine)
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(ContractMismatch):
        finish_execution(conn, claim, Finish("done", "DONE", None, [], ["a"], {}))
    assert _everything(runtime_engine) == before


def test_a_failure_never_releases_a_request_another_execution_holds(runtime_engine, owner_engine):
    claim = _started(runtime_engine, effect="READ_ONLY")
    other = start_execution(runtime_engine, flow_definition([action("b", "test.write")]))
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE request SET busy_execution_id = :other WHERE id = :id"),
            {"other": other, "id": claim.request_id},
        )
    with runtime_engine.connect() as conn:
        assert fail_execution(conn, claim, "REQUEST_CHANGED") == "FAILED"
    assert request_row(runtime_engine, claim.request_id).busy_execution_id == other


def test_a_checkpoint_left_unknown_is_a_write_in_doubt_on_its_own(runtime_engine, owner_engine):
    # Every UNKNOWN outcome also has its line in the history; the checkpoint's own status
    # is evidence enough without it.
    claim = _started(runtime_engine)
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE action_execution SET status = 'UNKNOWN' WHERE execution_id = :id"),
            {"id": claim.execution_id},
        )
    with runtime_engine.connect() as conn:
        assert fail_execution(conn, claim, "BOOM") == "RECONCILIATION_REQUIRED"
    assert execution(runtime_engine, claim.execution_id).error_detail["writesInDoubt"] == ["a"]
    assert request_row(runtime_engine, claim.request_id).busy_execution_id == claim.execution_id


def test_a_write_left_running_keeps_the_request_when_attempts_run_out(runtime_engine):
    # The holder died mid-call on the execution's last claim: the next claim is over
    # budget and fails the execution without running anything. The write it left
    # RUNNING may have happened, so the request stays blocked for an operator.
    write = Double("test.write", Effect.IDEMPOTENT_WRITE)
    eid = start_execution(
        runtime_engine, flow_definition([action("w", "test.write")]), max_attempts=1
    )
    crashing = Executor(registry_of(write), settings(), WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    expire_lease(runtime_engine, eid)

    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail["writesInDoubt"]) == ("ATTEMPTS_EXHAUSTED", ["w"])
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid
    assert checkpoints(runtime_engine, eid)["w"].status == "RUNNING"


def test_a_cancel_never_releases_a_request_another_execution_holds(runtime_engine, owner_engine):
    eid = start_execution(runtime_engine, flow_definition([action("a", "test.write")]))
    request_id = execution(runtime_engine, eid).request_id
    other = start_execution(runtime_engine, flow_definition([action("b", "test.write")]))
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE request SET busy_execution_id = :other WHERE id = :id"),
            {"other": other, "id": request_id},
        )
    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="not needed").status == "CANCELLED"
        )
    assert request_row(runtime_engine, request_id).busy_execution_id == other


def test_a_cancel_with_only_a_write_in_doubt_parks_and_keeps_the_request(runtime_engine):
    # Nothing succeeded, but the one write may have happened: not a case for CANCELLED.
    write = Double("test.write", output=scripted(UncertainError("no answer")))
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "RETRY_WAIT"
    with runtime_engine.connect() as conn:
        assert (
            cancel(conn, eid, org_id=ORG, actor="user-1", reason="not needed").status
            == "RECONCILIATION_REQUIRED"
        )
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail["writesInDoubt"]) == ("CANCELLED_AFTER_WRITES", ["w"])
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid


# --- recovery -----------------------------------------------------------------------------

# What a SUCCEEDED checkpoint recorded, changed so that it was recorded for something else.
MISMATCHES = {
    "inputHash": "input_hash = repeat('0', 64)",
    "externalKey": "external_key = 'another-key'",
    "effect": "effect = 'READ_ONLY'",
    "capability": "capability = 'test.other'",
    "adapterVersion": "adapter_version = 2",
}


@pytest.mark.parametrize("field", list(MISMATCHES))
def test_a_recovered_success_recorded_for_something_else_is_never_reused(
    runtime_engine, owner_engine, field
):
    first, second = Double("test.first"), Double("test.second")
    definition = flow_definition([action("a", "test.first"), action("b", "test.second")])
    eid = start_execution(runtime_engine, definition)

    def crash_before_b(claim: Claim, action_id: str) -> None:
        if action_id == "b":
            raise SimulatedCrash

    crashing = Executor(
        registry_of(first, second), settings(), WorkerHooks(before_adapter=crash_before_b)
    )
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    assert checkpoints(runtime_engine, eid)["a"].status == "SUCCEEDED"
    with owner_engine.begin() as conn:
        conn.execute(text(f"UPDATE action_execution SET {MISMATCHES[field]} WHERE action_id = 'a'"))
    expire_lease(runtime_engine, eid)

    status = run_once(runtime_engine, Executor(registry_of(first, second), settings()))

    assert status == "RECONCILIATION_REQUIRED"
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.error_detail["mismatched"]) == ("CONTRACT_MISMATCH", [field])
    assert len(first.calls) == 1 and len(second.calls) == 0


# --- waits ----------------------------------------------------------------------------


def test_a_stale_park_leaves_the_read_it_was_waiting_on_alone(runtime_engine):
    old = _started(runtime_engine, effect="READ_ONLY")
    _reclaimed(runtime_engine, old, "w2")
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        park_waiting(conn, old, "a", 60.0, "k", {"seen": 1})
    assert _everything(runtime_engine) == before


@pytest.mark.parametrize("case", ["write", "left running"])
def test_only_a_running_read_of_this_holder_can_wait(runtime_engine, case):
    if case == "write":
        claim = _started(runtime_engine, effect="IDEMPOTENT_WRITE")
    else:  # the previous holder's read, never started again by this one
        claim = _reclaimed(runtime_engine, _started(runtime_engine, effect="READ_ONLY"), "w2")
    before = _everything(runtime_engine)
    with runtime_engine.connect() as conn, pytest.raises(ContractMismatch):
        park_waiting(conn, claim, "a", 60.0, "k", None)
    assert _everything(runtime_engine) == before


# --- bounded waits ----------------------------------------------------------------------


def _setting(conn: Connection, name: str) -> int:
    return int(
        conn.execute(text("SELECT setting FROM pg_settings WHERE name = :n"), {"n": name}).scalar()
    )


def test_every_worker_connection_bounds_its_lock_and_statement_waits(database):
    # Asked for more than a quarter of a 4 s lease: a statement that waited that long
    # would outlive the lease it writes under, so both bounds stay at 1 s.
    worker = build_worker(
        settings(
            database_url=database.runtime_dsn,
            worker_lease_seconds=4,
            worker_renew_seconds=1,
            worker_statement_timeout_ms=10_000,
            worker_lock_timeout_ms=3_000,
        )
    )
    try:
        with worker.engine.connect() as conn:
            assert _setting(conn, "statement_timeout") == 1_000
            assert _setting(conn, "lock_timeout") == 1_000
    finally:
        worker.engine.dispose()
