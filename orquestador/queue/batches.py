"""The hot writes of many executions in one transaction: RUNNING, SUCCEEDED and finishes.

The worker's protocol writer (`worker/protocol_writer.py`) gathers what its jobs need
written at the same moment and hands it here as rows. `write_rows` writes them as
multi-row statements (one per kind, each row's values in arrays, `unnest`) in one
transaction, sent in one round trip, and answers each row on its own:

    BEGIN
    lock the requests of the finish rows, in id order            (finishes only)
    lock every execution of the batch under its own fence, in id order
    RUNNING checkpoints      (same effect per row as checkpoints._START)
    SUCCEEDED checkpoints    (same effect per row as checkpoints._SUCCEED[_OBSERVED])
    finishes                 (same effect per row as outcomes._COMPLETE and its checks)
    COMMIT

Every row carries its own fence (owner, token, live lease by clock_timestamp(), on
the execution row locked FOR UPDATE): a row that fails it writes nothing and is
answered LeaseLost, and its neighbours are written. All locks are taken before any
write, requests first and then executions, each set in id order, so two writers
(of this or another process) and the API's request-then-execution transactions
never wait on each other in a cycle; the locks last until COMMIT, so a reclaimer
(whose claim skips locked rows) cannot start before the batch has committed.

A finish row is all or nothing: its request update, audit row and execution update
are one statement joined on the execution, and the statement aborts the whole
transaction if one of them ever went without the others (it cannot, under the
locks). A database error aborts the transaction and is raised as `BatchFailed`;
the caller splits the batch and writes the halves again, so a bad row fails alone.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb

from orquestador.errors import ContractMismatch, RequestChanged
from orquestador.queue.checkpoints import ActionAttempt
from orquestador.queue.fencing import WORKER_ACTOR, Claim, refuse_stale
from orquestador.queue.outcomes import Finish, finish_documents

# Each statement takes its rows as one JSON array of objects (`jsonb_to_recordset`):
# one parameter, whatever the batch's size, so the prepared plan never changes and
# the driver encodes one document instead of an array per column. The ids also go
# through an array (`ANY (ARRAY(...))`): a generic plan cannot know how few rows the
# input holds, and would otherwise hash-join it with a scan of the whole table.

# The fence of one row, as FENCE in fencing.py, with the row's own owner and token.
_ROW_FENCE = """
    e.id = ANY (ARRAY(SELECT execution_id FROM input))
    AND e.id = i.execution_id
    AND e.status = 'RUNNING'
    AND e.lease_owner = i.owner
    AND e.fencing_token = i.token
    AND e.lease_expires_at > clock_timestamp()
"""

LOCK_REQUESTS = """
    SELECT r.id, r.state, r.revision, r.flow_id, r.busy_execution_id
    FROM request r
    WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(%(request_ids)s::jsonb)::uuid))
    ORDER BY r.id
    FOR UPDATE
"""

# Sorted, then locked: rows are locked in id order. What a finish's checks read
# comes back with its row (for the others it is not computed).
LOCK_EXECUTIONS = f"""
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
            AS i(execution_id uuid, token bigint, owner text, finishing boolean)
    )
    SELECT e.id, e.fencing_token, e.flow_id, e.accepted_state, e.accepted_revision,
           CASE WHEN i.finishing THEN
               coalesce((SELECT array_agg(a.action_id) FROM action_execution a
                         WHERE a.execution_id = e.id AND a.status = 'SUCCEEDED'), '{{}}')
           END AS succeeded
    FROM input i JOIN execution e ON e.id = i.execution_id
    WHERE {_ROW_FENCE}
    ORDER BY e.id
    FOR UPDATE OF e
"""

# Per row, what checkpoints._START does: the replaced attempt's line in the history,
# then the RUNNING checkpoint, under the same conditions. `written` is false for a
# row that holds its lease but may not start again (a ContractMismatch).
START_MANY = f"""
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
            AS i(execution_id uuid, token bigint, owner text, action_id text, attempt int,
                 input_hash text, external_key text, effect text, capability text,
                 adapter_version int)
    ), holder AS (
        SELECT i.* FROM input i JOIN execution e ON e.id = i.execution_id
        WHERE {_ROW_FENCE}
        ORDER BY e.id
        FOR UPDATE OF e
    ), interrupted AS (
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT a.execution_id, a.action_id, a.attempt, a.fencing_token,
               CASE WHEN a.effect = 'READ_ONLY' THEN 'FAILED' ELSE 'UNKNOWN' END,
               'INTERRUPTED', NULL, a.started_at, NULL
        FROM action_execution a
        JOIN holder h ON a.execution_id = h.execution_id AND a.action_id = h.action_id
        -- The array keeps any plan on the primary key, whatever the batch's size.
        WHERE a.execution_id = ANY (ARRAY(SELECT execution_id FROM holder))
          AND a.status = 'RUNNING' AND a.external_key = h.external_key
          AND a.effect <> 'NON_IDEMPOTENT_WRITE'
        ON CONFLICT DO NOTHING
    ), written AS (
        INSERT INTO action_execution AS a (
            execution_id, action_id, status, attempt, fencing_token, input_hash, external_key,
            effect, capability, adapter_version, output, error_code, started_at, finished_at,
            first_started_at)
        SELECT h.execution_id, h.action_id, 'RUNNING', h.attempt, h.token, h.input_hash,
               h.external_key, h.effect, h.capability, h.adapter_version, NULL, NULL,
               clock_timestamp(), NULL, clock_timestamp()
        FROM holder h
        ON CONFLICT (execution_id, action_id) DO UPDATE
        SET status = 'RUNNING', attempt = EXCLUDED.attempt,
            fencing_token = EXCLUDED.fencing_token, input_hash = EXCLUDED.input_hash,
            external_key = EXCLUDED.external_key, effect = EXCLUDED.effect,
            capability = EXCLUDED.capability, adapter_version = EXCLUDED.adapter_version,
            output = NULL, error_code = NULL, started_at = EXCLUDED.started_at,
            finished_at = NULL,
            first_started_at = coalesce(a.first_started_at, EXCLUDED.first_started_at)
        WHERE a.status <> 'SUCCEEDED'
          AND a.external_key = EXCLUDED.external_key
          AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE' AND a.status IN ('RUNNING', 'UNKNOWN'))
        RETURNING a.execution_id, a.first_started_at
    )
    SELECT h.execution_id, h.token, w.first_started_at, w.execution_id IS NOT NULL AS written
    FROM holder h LEFT JOIN written w ON w.execution_id = h.execution_id
"""

# Per row, what checkpoints._SUCCEED does (and _SUCCEED_OBSERVED: a row without an
# observation keeps the stored one).
SUCCEED_MANY = f"""
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
            AS i(execution_id uuid, token bigint, owner text, action_id text, output jsonb,
                 observed jsonb)
    ), holder AS (
        SELECT i.* FROM input i JOIN execution e ON e.id = i.execution_id
        WHERE {_ROW_FENCE}
        ORDER BY e.id
        FOR UPDATE OF e
    ), succeeded AS (
        UPDATE action_execution AS a
        SET status = 'SUCCEEDED', output = h.output, finished_at = clock_timestamp(),
            observed = coalesce(h.observed, a.observed)
        FROM holder h
        WHERE a.execution_id = ANY (ARRAY(SELECT execution_id FROM holder))
          AND a.execution_id = h.execution_id AND a.action_id = h.action_id
          AND a.status = 'RUNNING' AND a.fencing_token = h.token
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                  a.finished_at
    ), history AS (
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT execution_id, action_id, attempt, fencing_token, 'SUCCEEDED', NULL, NULL,
               started_at, finished_at
        FROM succeeded
    )
    SELECT h.execution_id, h.token, s.execution_id IS NOT NULL AS written
    FROM holder h LEFT JOIN succeeded s ON s.execution_id = h.execution_id
"""

# Per row, what outcomes._COMPLETE does once finish_execution's checks passed; here the
# checks are part of the statement (request unchanged since acceptance and held by
# this execution, every expected checkpoint SUCCEEDED), so a row that fails them
# writes nothing and its neighbours are written. The caller reads why from the locks.
FINISH_MANY = f"""
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
            AS i(execution_id uuid, token bigint, owner text, request_id uuid, state text,
                 data jsonb, detail jsonb, result jsonb, expected jsonb)
    ), holder AS (
        SELECT i.*, e.org_id, e.flow_id, e.transition_id, e.accepted_state,
               e.accepted_revision
        FROM input i JOIN execution e ON e.id = i.execution_id
        WHERE {_ROW_FENCE}
        ORDER BY e.id
        FOR UPDATE OF e
    ), moved AS (
        UPDATE request AS r
        SET data = h.data, state = h.state, revision = r.revision + 1,
            busy_execution_id = NULL, updated_at = clock_timestamp()
        FROM holder h
        WHERE r.id = ANY (ARRAY(SELECT request_id FROM holder))
          AND r.id = h.request_id AND r.busy_execution_id = h.execution_id
          AND r.flow_id = h.flow_id AND r.state = h.accepted_state
          AND r.revision = h.accepted_revision
          AND NOT EXISTS (
              SELECT 1 FROM jsonb_array_elements_text(h.expected) AS wanted(action_id)
              WHERE NOT EXISTS (SELECT 1 FROM action_execution a
                                WHERE a.execution_id = h.execution_id
                                  AND a.action_id = wanted.action_id
                                  AND a.status = 'SUCCEEDED'))
        RETURNING h.execution_id, r.revision
    ), audited AS (
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT h.org_id, 'TRANSITION_COMPLETED', h.request_id, h.execution_id, %(actor)s,
               h.detail || jsonb_build_object('revision', m.revision,
                                              'transitionId', h.transition_id,
                                              'fromState', h.accepted_state)
               || coalesce((SELECT jsonb_build_object(
                                       'observed', jsonb_object_agg(a.action_id, a.observed))
                            FROM action_execution a
                            WHERE a.execution_id = h.execution_id AND a.observed IS NOT NULL
                            HAVING count(*) > 0), '{{}}'::jsonb)
        FROM moved m JOIN holder h ON h.execution_id = m.execution_id
    ), completed AS (
        UPDATE execution AS e
        SET status = 'SUCCEEDED', result = h.result, error_code = NULL, error_detail = NULL,
            lease_owner = NULL, lease_expires_at = NULL, wait_key = NULL,
            finished_at = clock_timestamp(), updated_at = clock_timestamp()
        FROM moved m JOIN holder h ON h.execution_id = m.execution_id
        WHERE e.id = ANY (ARRAY(SELECT execution_id FROM moved)) AND e.id = m.execution_id
        RETURNING e.id
    )
    -- A moved request without its completed execution would be half a finish: the
    -- division by zero aborts the whole transaction instead (it cannot happen: the
    -- execution row is locked by this transaction and matched by id alone).
    SELECT m.execution_id, m.revision, 1 / (c.id IS NOT NULL)::int AS whole
    FROM moved m LEFT JOIN completed c ON c.id = m.execution_id
"""


@dataclass(frozen=True)
class StartRow:
    """Persist RUNNING before the adapter is called; answered with the step's first start."""

    claim: Claim
    attempt: ActionAttempt


@dataclass(frozen=True)
class SucceedRow:
    """Persist the validated output as SUCCEEDED, with what the step observed (or None)."""

    claim: Claim
    action_id: str
    output: Any
    observed: dict[str, Any] | None


@dataclass(frozen=True)
class FinishRow:
    """Commit the decided transition; `before_commit` is the test seam of the finish."""

    claim: Claim
    finish: Finish
    before_commit: Callable[[], None] | None = None


Row = StartRow | SucceedRow | FinishRow


class BatchFailed(Exception):
    """The transaction failed as a whole (nothing of it was kept); `error` says why."""

    def __init__(self, error: psycopg.Error, sql: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.sql = sql


class RowFailed(Exception):
    """A row's own seam raised before COMMIT; the transaction was rolled back."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


def _fence(claim: Claim) -> dict[str, Any]:
    return {"execution_id": str(claim.execution_id), "token": claim.token, "owner": claim.owner}


def _rows(rows: list[dict[str, Any]]) -> Jsonb:
    # A JSON null arrives as SQL NULL in jsonb_to_recordset: None stays "no value",
    # as JSONB_VALUE in db/schema.py makes it for single rows.
    return Jsonb(rows)


def _key(claim: Claim) -> tuple[uuid.UUID, int]:
    return (claim.execution_id, claim.token)


def _start_params(rows: list[StartRow]) -> dict[str, Any]:
    return {
        "rows": _rows(
            [
                {
                    **_fence(row.claim),
                    "action_id": row.attempt.action_id,
                    "attempt": row.attempt.attempt,
                    "input_hash": row.attempt.input_hash,
                    "external_key": row.attempt.external_key,
                    "effect": row.attempt.effect,
                    "capability": row.attempt.capability,
                    "adapter_version": row.attempt.adapter_version,
                }
                for row in rows
            ]
        )
    }


def _succeed_params(rows: list[SucceedRow]) -> dict[str, Any]:
    return {
        "rows": _rows(
            [
                {
                    **_fence(row.claim),
                    "action_id": row.action_id,
                    "output": row.output,
                    "observed": row.observed or None,
                }
                for row in rows
            ]
        )
    }


def _finish_params(rows: list[FinishRow]) -> dict[str, Any]:
    values = []
    for row in rows:
        detail, result = finish_documents(row.finish)
        values.append(
            {
                **_fence(row.claim),
                "request_id": str(row.claim.request_id),
                "state": row.finish.to_state,
                "data": row.finish.data,
                "detail": detail,
                "result": result,
                "expected": list(row.finish.action_ids),
            }
        )
    return {"rows": _rows(values), "actor": WORKER_ACTOR}


def _lock_params(rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "rows": _rows(
            [{**_fence(row.claim), "finishing": isinstance(row, FinishRow)} for row in rows]
        )
    }


def _request_change(request: Any, execution: Any, claim: Claim) -> str | None:
    # The same reasons, in the same order, as outcomes._request_change.
    if request.busy_execution_id != claim.execution_id:
        return "the request is no longer held by this execution"
    if request.flow_id != execution.flow_id:
        return "the request is pinned to another flow version"
    if request.state != execution.accepted_state or request.revision != execution.accepted_revision:
        return (
            f"request is {request.state!r} at revision {request.revision}, accepted in "
            f"{execution.accepted_state!r} at {execution.accepted_revision}"
        )
    return None


class _Statements:
    """The cursors of one batch, sent in one pipeline and read once it has synced."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.last_sql = ""

    def run(self, sql: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        self.last_sql = sql
        cursor = self.conn.cursor(row_factory=namedtuple_row)
        cursor.execute(sql, params, prepare=True)
        return cursor


def _roll_back(conn: psycopg.Connection[Any]) -> None:
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("ROLLBACK")


def write_rows(conn: psycopg.Connection[Any], rows: Sequence[Row]) -> list[Any]:
    """Write `rows` in one transaction on `conn` (autocommit mode); one answer per row.

    An answer is the row's result (a StartRow's first start, else None) or the
    exception its job raises: LeaseLost, ContractMismatch, RequestChanged. Raises
    BatchFailed when the transaction failed (nothing was kept), RowFailed when a
    row's `before_commit` raised (nothing was kept either).
    """
    starts = [row for row in rows if isinstance(row, StartRow)]
    succeeds = [row for row in rows if isinstance(row, SucceedRow)]
    finishes = [row for row in rows if isinstance(row, FinishRow)]
    hooked = any(row.before_commit is not None for row in finishes)
    statements = _Statements(conn)
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            requests = (
                statements.run(
                    LOCK_REQUESTS,
                    {"request_ids": Jsonb([str(row.claim.request_id) for row in finishes])},
                )
                if finishes
                else None
            )
            locked = statements.run(LOCK_EXECUTIONS, _lock_params(rows))
            started = statements.run(START_MANY, _start_params(starts)) if starts else None
            succeeded = (
                statements.run(SUCCEED_MANY, _succeed_params(succeeds)) if succeeds else None
            )
            finished = statements.run(FINISH_MANY, _finish_params(finishes)) if finishes else None
            if not hooked:
                # COMMIT goes in the same round trip: the answers are read only after it.
                conn.execute("COMMIT")
        request_rows = {r.id: r for r in requests.fetchall()} if requests else {}
        locked_rows = {(r.id, r.fencing_token): r for r in locked.fetchall()}
        started_rows = {(r.execution_id, r.token): r for r in started.fetchall()} if started else {}
        succeeded_rows = (
            {(r.execution_id, r.token): r for r in succeeded.fetchall()} if succeeded else {}
        )
        finished_ids = {r.execution_id for r in finished.fetchall()} if finished else set()
        if hooked:
            for index, row in enumerate(rows):
                if isinstance(row, FinishRow) and row.before_commit is not None:
                    if row.claim.execution_id not in finished_ids:
                        continue  # refused below: its seam is never reached, as before
                    try:
                        row.before_commit()
                    except BaseException as exc:
                        _roll_back(conn)
                        raise RowFailed(index, exc) from exc
            conn.execute("COMMIT")
    except psycopg.Error as exc:
        with contextlib.suppress(psycopg.Error):  # gone: the caller sees it broken
            _roll_back(conn)
        raise BatchFailed(exc, statements.last_sql) from exc

    answers: list[Any] = []
    for row in rows:
        key = _key(row.claim)
        if isinstance(row, StartRow):
            found = started_rows.get(key)
            action_id = row.attempt.action_id
            if found is None:
                answers.append(refuse_stale(row.claim, f"start checkpoint {action_id}"))
            elif not found.written:
                answers.append(
                    ContractMismatch(
                        f"checkpoint {action_id} of execution {row.claim.execution_id} may not "
                        "be started again (succeeded, other key, or an interrupted "
                        "non-idempotent write)"
                    )
                )
            else:
                answers.append(found.first_started_at)
        elif isinstance(row, SucceedRow):
            found = succeeded_rows.get(key)
            if found is None or not found.written:
                answers.append(refuse_stale(row.claim, f"succeed checkpoint {row.action_id}"))
            else:
                answers.append(None)
        else:
            answers.append(_finish_answer(row, locked_rows, request_rows, finished_ids))
    return answers


def _finish_answer(
    row: FinishRow,
    locked_rows: dict[tuple[uuid.UUID, int], Any],
    request_rows: dict[uuid.UUID, Any],
    finished_ids: set[uuid.UUID],
) -> Exception | None:
    claim = row.claim
    if claim.execution_id in finished_ids:
        return None
    # Why it was refused, in finish_execution's order: lease, request, checkpoints.
    execution = locked_rows.get(_key(claim))
    if execution is None:
        return refuse_stale(claim, "finish")
    request = request_rows.get(claim.request_id)
    if request is None:
        return refuse_stale(claim, "finish")
    change = _request_change(request, execution, claim)
    if change:
        return RequestChanged(change)
    missing = [a for a in row.finish.action_ids if a not in set(execution.succeeded or ())]
    if missing:
        return ContractMismatch(f"checkpoints not SUCCEEDED at finish: {missing}")
    return refuse_stale(claim, "finish")  # the lease ran out between the lock and the write
