"""Claiming due executions: one statement that locks, skips what others hold, and leases."""

from __future__ import annotations

from sqlalchemy import Connection, text

from orquestador.queue.fencing import Claim
from orquestador.queue.prepared import run_alone

# Two sources of work, each read through its own partial index and locked with
# SKIP LOCKED so that concurrent claimers split the rows instead of queueing on
# each other. now() (this transaction's start) serves the index conditions; the
# claim is the transaction's first statement, so it differs from clock_timestamp()
# by microseconds and only ever in the conservative direction.
_CLAIM = text(
    """
    WITH waiting AS (
        -- New work and retries whose backoff has elapsed, oldest due first.
        SELECT id, next_attempt_at, created_at
        FROM execution
        WHERE status IN ('PENDING', 'RETRY_WAIT') AND next_attempt_at <= now()
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), abandoned AS (
        -- RUNNING rows whose holder let the lease lapse (crashed, hung or partitioned):
        -- taking them bumps the token, which fences the old holder out for good.
        SELECT id, next_attempt_at, created_at
        FROM execution
        WHERE status = 'RUNNING' AND lease_expires_at <= now()
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), chosen AS (
        -- One order across both sources; at most :limit rows (the free executor slots).
        SELECT id FROM (SELECT * FROM waiting UNION ALL SELECT * FROM abandoned) AS due
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
    )
    UPDATE execution AS e
    SET status = 'RUNNING',
        attempts = e.attempts + 1,
        fencing_token = e.fencing_token + 1,
        lease_owner = :owner,
        lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
        started_at = coalesce(e.started_at, clock_timestamp()),
        updated_at = clock_timestamp()
    FROM chosen
    WHERE e.id = chosen.id
    RETURNING e.id, e.fencing_token, e.attempts, e.max_attempts, e.request_id,
              e.lease_expires_at, e.next_attempt_at, e.created_at,
              clock_timestamp() AS claimed_at
    """
)


def claim_due_executions(
    conn: Connection, owner: str, limit: int, lease_seconds: float
) -> list[Claim]:
    """Claim up to `limit` due executions for `owner` and commit before returning them."""
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
        )
        for row in rows
    ]
