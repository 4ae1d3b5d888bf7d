"""Claiming due executions: one statement that locks, skips what others hold, and leases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from orquestador.queue.fencing import Claim
from orquestador.queue.prepared import run_alone
from orquestador.queue.snapshots import LoadedExecution

# Two sources of work, each read through its own partial index and locked with
# SKIP LOCKED so that concurrent claimers split the rows instead of queueing on
# each other. Each source locks only what it takes, so the statement never holds
# more than :limit rows that another claimer must then skip. now() (this
# transaction's start) serves the index conditions; the claim is the transaction's
# first statement, so it differs from clock_timestamp() by microseconds and only ever
# in the conservative direction.
_CLAIM = text(
    """
    WITH abandoned AS (
        -- RUNNING rows whose holder let the lease lapse (crashed, hung or partitioned):
        -- taking them bumps the token, which fences the old holder out for good. They
        -- go first: each keeps its request busy, and it was due before anything else.
        SELECT id
        FROM execution
        WHERE status = 'RUNNING' AND lease_expires_at <= now()
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), waiting AS (
        -- New work, retries whose backoff has elapsed and waits that ran out or were
        -- woken, oldest due first, up to what the abandoned rows left of :limit (the
        -- free executor slots).
        SELECT id
        FROM execution
        WHERE status IN ('PENDING', 'RETRY_WAIT', 'WAITING') AND next_attempt_at <= now()
        ORDER BY next_attempt_at, created_at, id
        LIMIT (SELECT :limit - count(*) FROM abandoned)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE execution AS e
    SET status = 'RUNNING',
        -- A wait's next round is the same attempt going on: it spends none. (A holder
        -- that dies during the round leaves it RUNNING; that reclaim counts.) wait_key
        -- stays while the round runs, so a wake that lands meanwhile is not lost.
        attempts = e.attempts + CASE WHEN e.status = 'WAITING' THEN 0 ELSE 1 END,
        fencing_token = e.fencing_token + 1,
        lease_owner = :owner,
        lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
        started_at = coalesce(e.started_at, clock_timestamp()),
        updated_at = clock_timestamp()
    FROM request AS r, flow AS f
    -- An array, not a join with the sources: a cached generic plan cannot know how few
    -- rows they hold and would hash-join them with a scan of the whole table.
    WHERE e.id = ANY (ARRAY(SELECT id FROM abandoned UNION ALL SELECT id FROM waiting))
      AND r.id = e.request_id AND f.id = e.flow_id
    RETURNING e.id, e.fencing_token, e.attempts, e.max_attempts, e.request_id,
              e.lease_expires_at, e.next_attempt_at, e.created_at,
              clock_timestamp() AS claimed_at,
              -- What the load reads, used only for a first holder (see _snapshot).
              e.org_id, e.flow_id, e.transition_id, e.accepted_state, e.accepted_revision,
              e.simulation, e.actor_snapshot ->> 'sub' AS actor,
              r.state AS request_state, r.revision AS request_revision,
              r.flow_id AS request_flow_id, r.busy_execution_id, r.owner_id, r.data,
              f.version AS flow_version, f.definition, f.data_schema
    """
)


def _snapshot(row: Any) -> LoadedExecution | None:
    """The loaded execution, read by the claim itself, when this is its first holder.

    Token 1 means no one held the execution before this claim, so no checkpoint can
    exist and there is nothing that a separate load, reading after the claim
    committed, could see and this statement not. A later holder (a retry or a
    recovery) loads separately under the fence, after its claim committed: the
    previous holder's last checkpoint may have committed while this statement ran.
    The request read here is the one the load would read; nothing but this
    execution writes a busy request, and the finish checks it again anyway.
    """
    if row.fencing_token != 1:
        return None
    return LoadedExecution.from_row(row, checkpoints={})


def claim_due_executions(
    conn: Connection, owner: str, limit: int, lease_seconds: float
) -> list[Claim]:
    """Claim up to `limit` due executions for `owner` and commit before returning them.

    A first holder's claim carries its loaded execution (`Claim.snapshot`), which
    saves the worker the separate load.
    """
    if limit <= 0:
        return []
    rows = run_alone(
        conn, _CLAIM, {"limit": limit, "owner": owner, "lease_seconds": float(lease_seconds)}
    ).fetchall()
    # RETURNING gives no order; hand the claims out in the order they were chosen.
    rows.sort(key=lambda row: (row.next_attempt_at, row.created_at, row.id))
    return [
        Claim(
            execution_id=row.id,
            token=row.fencing_token,
            owner=owner,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            request_id=row.request_id,
            lease_expires_at=row.lease_expires_at,
            created_at=row.created_at,
            claimed_at=row.claimed_at,
            snapshot=_snapshot(row),
        )
        for row in rows
    ]
