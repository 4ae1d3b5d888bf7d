"""The hot writes of many executions in one transaction: RUNNING, SUCCEEDED and finishes.

The worker's protocol writer (`worker/protocol_writer.py`) gathers what its jobs need
written at the same moment and hands it here as rows. `write_rows` writes them with
one statement, the `orquestador_write_batch` function (migration 0011), in its own
implicit transaction, and answers each row on its own. The function runs, in order:

    lock the requests of the finish rows, in id order, skipping locked ones
    lock every execution of the batch under its own fence, in id order, skipping
        locked ones (a row skipped for a lock is answered busy)
    SUCCEEDED checkpoints    (same effect per row as checkpoints._SUCCEED[_OBSERVED]; a
                             read's whole attempt upserted, migration 0036)
    RUNNING checkpoints      (same effect per row as checkpoints._START)
    finishes                 (same effect per row as outcomes._COMPLETE and its checks)
    check that no lease it locked ran out before COMMIT, else fail the whole batch

A row is a set of writes that stand or fall together, and it is answered by
(execution id, fencing token), never by id alone (a stale and a current holder of one
execution may share a batch). Its fence (owner, token, live lease by
clock_timestamp(), on the execution row locked FOR UPDATE) is checked once, when the
row is locked: a row that fails it writes nothing and is answered LeaseLost, and its
neighbours are written. A riding SUCCEEDED is written before its row's RUNNING or
finish, and a row whose riding SUCCEEDED was refused writes nothing else.

A row another session holds locked (an operator's open transaction on its request,
say) is skipped rather than waited for, and answered busy: the writer tries it again
alone, and the rest of the batch commits at once. All locks are taken before any
write, requests first and then executions, each set in id order; the locks last until
COMMIT, so a reclaimer (whose claim skips locked rows) cannot start before the batch
has committed.

Each row kind goes in as one JSON array of objects (`jsonb_to_recordset`): one
parameter whatever the batch's size, so the prepared plans never change. The ids also
go through arrays (`ANY (ARRAY(...))`): a generic plan cannot know how few rows the
input holds, and would otherwise hash-join it with a scan of the whole table.

A database error aborts the transaction and is raised as `BatchFailed`; the caller
splits the batch and writes the halves again, so a bad row fails alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from orquestador.db.schema import WRITE_BATCH_FUNCTION
from orquestador.errors import CancelRequested, ContractMismatch, RequestChanged
from orquestador.queue.checkpoints import ActionAttempt
from orquestador.queue.fencing import WORKER_ACTOR, Claim, refuse_stale
from orquestador.queue.outcomes import Finish, finish_documents, request_change
from orquestador.queue.prepared import prepares

WRITE_BATCH = f"""
    SELECT {WRITE_BATCH_FUNCTION}(%(request_ids)s::jsonb, %(locks)s::jsonb, %(starts)s::jsonb,
                                  %(succeeds)s::jsonb, %(finishes)s::jsonb, %(actor)s)
"""


@dataclass(frozen=True)
class RidingSuccess:
    """Persist the validated output as SUCCEEDED, with what the step observed (or None).

    A safe step's success rides in the transaction of the run's next write (a StartRow's
    or a FinishRow's `succeed`); written as a row of its own when nothing takes it.
    `attempt` and `started_at` are a read's whole attempt, when it wrote no RUNNING
    checkpoint before its call: the checkpoint is then written whole, as it ended."""

    claim: Claim
    action_id: str
    output: Any
    observed: dict[str, Any] | None
    attempt: ActionAttempt | None = None
    started_at: datetime | None = None
    # A non-idempotent write's success, written alone: answered CancelRequested (once
    # written) when a person asked to cancel, so that the next step, which may write no
    # RUNNING checkpoint, is not called.
    asks_cancel: bool = False


@dataclass(frozen=True)
class StartRow:
    """Persist RUNNING before the adapter is called; answered with the step's first start.

    `succeed` are the previous steps' SUCCEEDED checkpoints that ride in the same
    transaction (see FinishRow): durable, like the RUNNING row, before the call.
    `started_at` (database time) records a read's call that already ran and did not
    succeed: its RUNNING checkpoint, written just before its outcome (never held back
    by a cancel request: it starts nothing).
    """

    claim: Claim
    attempt: ActionAttempt
    succeed: tuple[RidingSuccess, ...] = ()
    started_at: datetime | None = None


@dataclass(frozen=True)
class FinishRow:
    """Commit the decided transition; `before_commit` is the test seam of the finish.

    `succeed` are the SUCCEEDED checkpoints that ride in the same transaction (the
    last step's, and those of the reads before it since the run's last write), written
    before the finish's checks: they commit together or not at all (the job writes the
    checkpoints alone when the transaction fails), and a finish refused after the
    transaction committed leaves them written. A refused riding checkpoint (a lost
    lease) is the row's answer.
    """

    claim: Claim
    finish: Finish
    before_commit: Callable[[], None] | None = None
    succeed: tuple[RidingSuccess, ...] = ()


Row = StartRow | RidingSuccess | FinishRow


class BatchFailed(Exception):
    """The transaction failed as a whole (nothing of it was kept); `error` says why."""

    def __init__(self, error: psycopg.Error, sql: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.sql = sql


class RowBusy(Exception):
    """Another session holds a lock this row needs; nothing of the row was written."""


class RowFailed(Exception):
    """A row's own seam raised before COMMIT; the transaction was rolled back."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


def _fence(claim: Claim) -> dict[str, Any]:
    return {"execution_id": str(claim.execution_id), "token": claim.token, "owner": claim.owner}


def _rows(rows: list[Any]) -> Jsonb | None:
    # A JSON null arrives as SQL NULL in jsonb_to_recordset: None stays "no value",
    # as JSONB_VALUE in db/schema.py makes it for single rows. No rows: the step is skipped.
    return Jsonb(rows) if rows else None


def _key(claim: Claim) -> tuple[str, int]:
    # As the answer names a row: the execution id as text, and the token.
    return (str(claim.execution_id), claim.token)


def _riders(row: StartRow | FinishRow) -> dict[str, Any]:
    # The riding SUCCEEDED checkpoints this row's other writes depend on: all written.
    if not row.succeed:
        return {"after_action": None}
    return {"after_action": row.succeed[0].action_id, "riders": len(row.succeed)}


def _start(row: StartRow) -> dict[str, Any]:
    started = row.started_at.isoformat() if row.started_at is not None else None
    return {**_fence(row.claim), **row.attempt.params, **_riders(row), "started_at": started}


def _succeed(row: RidingSuccess) -> dict[str, Any]:
    params = {
        **_fence(row.claim),
        "action_id": row.action_id,
        "output": row.output,
        "observed": row.observed or None,
    }
    if row.attempt is not None and row.started_at is not None:
        params.update(row.attempt.params, started_at=row.started_at.isoformat())
    return params


def _finish(row: FinishRow) -> dict[str, Any]:
    detail, result = finish_documents(row.finish)
    return {
        **_fence(row.claim),
        "request_id": str(row.claim.request_id),
        "state": row.finish.to_state,
        "data": row.finish.data,
        "detail": detail,
        "result": result,
        "expected": list(row.finish.action_ids),
        **_riders(row),
    }


def _lock(row: Row) -> dict[str, Any]:
    finishing = isinstance(row, FinishRow)
    return {
        **_fence(row.claim),
        "finishing": finishing,
        "request_id": str(row.claim.request_id) if finishing else None,
    }


def _params(rows: Sequence[Row]) -> dict[str, Any]:
    starts = [row for row in rows if isinstance(row, StartRow)]
    finishes = [row for row in rows if isinstance(row, FinishRow)]
    succeeds = [row for row in rows if isinstance(row, RidingSuccess)] + [
        rider for row in rows if not isinstance(row, RidingSuccess) for rider in row.succeed
    ]
    return {
        "request_ids": _rows([str(row.claim.request_id) for row in finishes]),
        "locks": Jsonb([_lock(row) for row in rows]),
        "starts": _rows([_start(row) for row in starts]),
        "succeeds": _rows([_succeed(row) for row in succeeds]),
        "finishes": _rows([_finish(row) for row in finishes]),
        "actor": WORKER_ACTOR,
    }


class _Request(NamedTuple):
    id: str
    state: str
    revision: int
    flow_id: str
    busy_execution_id: uuid.UUID | None


def _request(
    id: str, state: str, revision: int, flow_id: str, busy_execution_id: str | None
) -> _Request:
    # The holder as a uuid, compared with the claim's as the one-execution finish does.
    busy = uuid.UUID(busy_execution_id) if busy_execution_id else None
    return _Request(id, state, revision, flow_id, busy)


class _Locked(NamedTuple):
    id: str
    fencing_token: int
    flow_id: str
    accepted_state: str
    accepted_revision: int
    succeeded: list[str] | None  # for a finish row: its SUCCEEDED checkpoints


def _call(conn: psycopg.Connection[Any], params: dict[str, Any]) -> dict[str, Any]:
    row = conn.execute(WRITE_BATCH, params, prepare=prepares(conn)).fetchone()
    assert row is not None
    return row[0]


def write_rows(
    conn: psycopg.Connection[Any],
    rows: Sequence[Row],
    clock: Callable[[datetime], None] | None = None,
) -> list[Any]:
    """Write `rows` in one transaction on `conn` (autocommit mode); one answer per row.

    An answer is the row's result (a StartRow's first start, else None) or the
    exception its job raises: LeaseLost, ContractMismatch, RequestChanged, and
    CancelRequested for a start or finish of an execution a person asked to cancel. Raises
    BatchFailed when the transaction failed (nothing was kept), RowFailed when a
    row's `before_commit` raised (nothing was kept either).
    """
    params = _params(rows)
    hooked = [
        (index, row)
        for index, row in enumerate(rows)
        if isinstance(row, FinishRow) and row.before_commit is not None
    ]
    try:
        if not hooked:
            written = _call(conn, params)  # its own transaction: committed when it returns
        else:
            conn.execute("BEGIN")
            written = _call(conn, params)
            finished = {(row[0], row[1]) for row in written["finished"]}
            for index, hooked_row in hooked:
                if _key(hooked_row.claim) not in finished:
                    continue  # refused below: its seam is never reached, as before
                try:
                    assert hooked_row.before_commit is not None
                    hooked_row.before_commit()
                except BaseException as exc:
                    conn.execute("ROLLBACK")
                    raise RowFailed(index, exc) from exc
            conn.execute("COMMIT")
    except psycopg.Error as exc:
        if hooked and not (conn.closed or conn.broken):
            idle = psycopg.pq.TransactionStatus.IDLE
            if conn.info.transaction_status != idle:
                conn.execute("ROLLBACK")
        raise BatchFailed(exc, WRITE_BATCH) from exc

    if clock is not None and written.get("at"):  # before migration 0036: no clock
        clock(datetime.fromisoformat(written["at"]))
    requests = {row[0]: _request(*row) for row in written["requests"]}
    locked = {(row[0], row[1]): _Locked(*row) for row in written["locked"]}
    started = {(row[0], row[1]): row for row in written["started"]}
    # (execution id, token, action id); before migration 0036 without the action id.
    succeeded = {(row[0], row[1], row[2] if len(row) > 2 else None) for row in written["succeeded"]}
    finished = {(row[0], row[1]) for row in written["finished"]}
    # A function of migration 0010 waits for locks instead and never answers busy.
    busy = {(row[0], row[1]) for row in written.get("busy", ())}
    # Before migration 0034 the function knows no cancel request.
    cancel = {(row[0], row[1]) for row in written.get("cancelRequested", ())}

    answers: list[Any] = []
    for row in rows:
        if _key(row.claim) in busy:
            answers.append(
                RowBusy(f"execution {row.claim.execution_id} is locked by another session")
            )
            continue
        if isinstance(row, RidingSuccess):
            refusal = _succeed_answer(row, succeeded, locked)
            if refusal is None and row.asks_cancel and _key(row.claim) in cancel:
                refusal = CancelRequested(
                    f"execution {row.claim.execution_id}: a cancel was requested"
                )
            answers.append(refusal)
            continue
        refused = next(
            (
                answer
                for rider in row.succeed
                if (answer := _succeed_answer(rider, succeeded, locked)) is not None
            ),
            None,
        )
        if refused is not None:
            answers.append(refused)
        elif _key(row.claim) in cancel and not _records_a_call(row):
            # Neither the RUNNING nor the finish was written (a riding SUCCEEDED was).
            answers.append(
                CancelRequested(f"execution {row.claim.execution_id}: a cancel was requested")
            )
        elif isinstance(row, StartRow):
            answers.append(_start_answer(row, started.get(_key(row.claim))))
        else:
            answers.append(_finish_answer(row, locked, requests, finished))
    return answers


def _records_a_call(row: StartRow | FinishRow) -> bool:
    # A read's call that already ran, recorded before its outcome: a cancel does not
    # hold it back (the outcome's own write honours the request).
    return isinstance(row, StartRow) and row.started_at is not None


def _start_answer(row: StartRow, found: list[Any] | None) -> datetime | Exception:
    action_id = row.attempt.action_id
    if found is None:
        return refuse_stale(row.claim, f"start checkpoint {action_id}")
    _, _, first_started_at, written = found
    if not written:
        return ContractMismatch(
            f"checkpoint {action_id} of execution {row.claim.execution_id} may not "
            "be started again (succeeded, other key, or an interrupted "
            "non-idempotent write)"
        )
    return datetime.fromisoformat(first_started_at)


def _succeed_answer(
    row: RidingSuccess,
    succeeded: set[tuple[str, int, str | None]],
    locked: dict[tuple[str, int], Any],
) -> Exception | None:
    key = _key(row.claim)
    if (*key, row.action_id) in succeeded or (*key, None) in succeeded:
        return None
    if row.attempt is not None and key in locked:
        # Held under its fence, yet not written: the checkpoint there may not be
        # replaced (a success, another key), as a start would have been told.
        return ContractMismatch(
            f"checkpoint {row.action_id} of execution {row.claim.execution_id} may not be "
            "recorded (succeeded, other key, or an interrupted non-idempotent write)"
        )
    return refuse_stale(row.claim, f"succeed checkpoint {row.action_id}")


def _finish_answer(
    row: FinishRow,
    locked: dict[tuple[str, int], _Locked],
    requests: dict[str, _Request],
    finished: set[tuple[str, int]],
) -> Exception | None:
    claim = row.claim
    if _key(claim) in finished:
        return None
    # Why it was refused, in finish_execution's order: lease, request, checkpoints.
    execution = locked.get(_key(claim))
    if execution is None:
        return refuse_stale(claim, "finish")
    request = requests.get(str(claim.request_id))
    if request is None:
        return refuse_stale(claim, "finish")
    change = request_change(request, execution, claim)
    if change:
        return RequestChanged(change)
    # The lock read the checkpoints before this transaction wrote the riding ones.
    succeeded = set(execution.succeeded or ())
    succeeded.update(rider.action_id for rider in row.succeed)
    missing = [a for a in row.finish.action_ids if a not in succeeded]
    if missing:
        return ContractMismatch(f"checkpoints not SUCCEEDED at finish: {missing}")
    return refuse_stale(claim, "finish")  # the lease ran out between the lock and the write
