"""An earlier holder's call that may still be on its way: when its look-up can be trusted.

A holder that lost its lease (killed, or paused by a GC or a frozen VM) left its step's
attempt RUNNING. If that holder is only paused, its request may not have left yet: a
look-up now truthfully answers NotFound, and the request arrives once the holder wakes.
Every adapter refuses to send after its attempt's deadline (`ActionContext.check_deadline`),
so a NotFound is proof only once database time has passed the attempt's start + the
adapter's timeout + ADAPTER_ABANDON_GRACE_SECONDS. Until then the new holder puts the
execution back in RETRY_WAIT, due at that moment, and gives back the attempt its claim
counted; the checkpoint is not touched, so the next claim asks again from the same place.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.queue.fencing import FENCE, WORKER_ACTOR, Claim, refuse_stale, still_holds
from orquestador.queue.transactions import one_statement

EARLIER_CALL_PENDING = "EARLIER_CALL_PENDING"

# The wait and its audit row in one statement, only while the earlier attempt's call may
# still send: a stale holder writes neither, and a settled attempt leaves the row alone.
_AWAIT_EARLIER_CALL = text(
    f"""
    WITH earlier AS (
        SELECT a.started_at + make_interval(secs => :settle_seconds) AS settles_at
        FROM action_execution a
        WHERE a.execution_id = :execution_id AND a.action_id = :action_id
          AND a.status = '{CheckpointStatus.RUNNING}' AND a.attempt = :attempt
    ), waited AS (
        UPDATE execution AS e
        SET status = '{ExecutionStatus.RETRY_WAIT}',
            next_attempt_at = x.settles_at,
            -- Nothing was called: give back the attempt this claim counted.
            attempts = greatest(e.attempts - 1, 0),
            lease_owner = NULL, lease_expires_at = NULL,
            error_code = '{EARLIER_CALL_PENDING}',
            updated_at = clock_timestamp()
        FROM earlier x
        WHERE {FENCE}
          AND x.settles_at > clock_timestamp()
        RETURNING e.id, e.org_id, e.request_id, e.next_attempt_at
    )
    INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
    SELECT w.org_id, '{EARLIER_CALL_PENDING}', w.request_id, w.id, :actor,
           jsonb_build_object('actionId', CAST(:action_id AS text),
                              'attempt', CAST(:attempt AS integer),
                              'dueAt', w.next_attempt_at)
    FROM waited w
    RETURNING (SELECT next_attempt_at FROM waited) AS due_at
    """
)


def await_earlier_call(
    conn: Connection, claim: Claim, *, action_id: str, attempt: int, settle_seconds: float
) -> datetime | None:
    """Back to RETRY_WAIT until the earlier holder's attempt `attempt` of `action_id` can no
    longer send (its start + `settle_seconds`, database time); None once it already cannot.

    Raises LeaseLost when this claim no longer holds the execution.
    """
    params = {
        **claim.params,
        "action_id": action_id,
        "attempt": attempt,
        "settle_seconds": float(settle_seconds),
        "actor": WORKER_ACTOR,
    }
    with one_statement(conn):
        row = conn.execute(_AWAIT_EARLIER_CALL, params).first()
    if row is not None:
        return row.due_at
    with one_statement(conn):
        holds = still_holds(conn, claim)
    if not holds:
        raise refuse_stale(claim, "wait for an earlier holder's call")
    return None
