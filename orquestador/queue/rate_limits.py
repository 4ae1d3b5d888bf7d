"""Rate limits on routes: a token bucket per route in the database, shared by every worker.

A call takes a token before its RUNNING checkpoint is written. The bucket refills at the
route's `per_second` up to its `burst`, computed from the time since it was last
refilled, so nothing has to tick. One upsert both refills and takes, and takes only if
a whole token is there: two workers taking at once queue on the bucket's row lock and
the second sees what the first left.

A call with no token is not made: the execution goes back to RETRY_WAIT, due when the
next token should be there, and gives back the attempt its claim counted; a RATE_LIMITED
audit row says so. The step's checkpoint is not touched, so the next claim goes on from
the same place.
"""

from __future__ import annotations

import random

from sqlalchemy import Connection, text

from orquestador.actions.contracts import RateLimit
from orquestador.domain.statuses import ExecutionStatus
from orquestador.queue.fencing import FENCE, WORKER_ACTOR, Claim, refuse_stale
from orquestador.queue.transactions import one_statement

RATE_LIMITED = "RATE_LIMITED"

# What the bucket holds now: what it held, refilled for the time since (never for a
# negative time: a taker whose transaction began earlier may come second).
_REFILLED = (
    "least(:burst, b.tokens + :per_second * greatest(0, extract(epoch FROM now() - b.refilled_at)))"
)

_TAKE = text(
    f"""
    INSERT INTO rate_bucket AS b (name, tokens, refilled_at)
    VALUES (:name, :burst - 1, now())
    ON CONFLICT (name) DO UPDATE
    SET tokens = {_REFILLED} - 1,
        refilled_at = greatest(b.refilled_at, now())
    WHERE {_REFILLED} >= 1
    RETURNING 1
    """
)

# Read in a statement of its own after a refusal, so it sees what the takers that
# went first committed (the refusing statement's snapshot predates them).
_TOKENS = text(f"SELECT {_REFILLED} AS tokens FROM rate_bucket b WHERE b.name = :name")

# The wait and its audit row in one statement: a stale holder writes neither.
_WAIT_FOR_TOKEN = text(
    f"""
    WITH waited AS (
        UPDATE execution AS e
        SET status = '{ExecutionStatus.RETRY_WAIT}',
            -- A cancel asked meanwhile: due at once, for the next holder to apply it.
            next_attempt_at = CASE WHEN e.cancel_requested_at IS NOT NULL THEN clock_timestamp()
                                   ELSE clock_timestamp() + make_interval(secs => :delay_seconds)
                              END,
            -- No call was made: give back the attempt the claim counted, if it counted one.
            attempts = e.attempts - :counted,
            lease_owner = NULL, lease_expires_at = NULL, error_code = '{RATE_LIMITED}',
            updated_at = clock_timestamp()
        WHERE {FENCE}
        RETURNING e.id, e.org_id, e.request_id, e.next_attempt_at
    )
    INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
    SELECT w.org_id, '{RATE_LIMITED}', w.request_id, w.id, :actor,
           jsonb_build_object('actionId', CAST(:action_id AS text),
                              'capability', CAST(:capability AS text),
                              'dueAt', w.next_attempt_at)
    FROM waited w
    RETURNING id
    """
)


def take_token(conn: Connection, name: str, limit: RateLimit) -> float | None:
    """Take a token from the bucket `name`: None if taken, else the seconds to wait.

    Waiters all told the same moment would all come back for one token; a random part
    of half a token's interval spreads them.
    """
    params = {"name": name, "per_second": limit.per_second, "burst": float(limit.burst)}
    with one_statement(conn):
        if conn.execute(_TAKE, params).first() is not None:
            return None
    with one_statement(conn):
        tokens = conn.execute(_TOKENS, params).scalar()
    missing = max(0.0, 1.0 - (tokens or 0.0))
    return max(0.005, (missing + random.uniform(0.0, 0.5)) / limit.per_second)


def wait_for_token(
    conn: Connection,
    claim: Claim,
    *,
    action_id: str,
    capability: str,
    delay_seconds: float,
    counted: bool = True,
) -> None:
    """Back to RETRY_WAIT for `delay_seconds` without spending an attempt (under the fence),
    with a RATE_LIMITED audit row naming the step and when it is due again.

    `counted`: whether the claim counted an attempt (a wait's next round counts none).
    """
    params = {
        **claim.params,
        "delay_seconds": float(delay_seconds),
        "counted": int(counted),
        "actor": WORKER_ACTOR,
        "action_id": action_id,
        "capability": capability,
    }
    with one_statement(conn):
        row = conn.execute(_WAIT_FOR_TOKEN, params).first()
    if row is None:
        raise refuse_stale(claim, "wait for a rate limit token")
