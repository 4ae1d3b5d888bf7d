"""Renewing every held lease in one statement, and giving a lease back early."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import Connection, text

from orquestador.queue.fencing import FENCE, Claim
from orquestador.queue.transactions import one_statement

# One statement for all held leases: the heartbeat's cost does not grow with the
# number of round trips. A row renews only while RUNNING under the exact owner and
# token and while its lease is still valid by database time, so an expired lease
# never comes back to life, even if no one has reclaimed it yet.
#
# The rows are locked first, in id order, as the protocol writer locks the executions
# of a batch (`queue/batches.py`): two statements that lock several executions in the
# same order never wait on each other in a cycle.
_RENEW = text(
    """
    WITH held AS (
        SELECT e.id
        FROM execution AS e
        JOIN unnest(CAST(:ids AS uuid[]), CAST(:tokens AS bigint[])) AS h(id, token)
          ON e.id = h.id
        WHERE e.id = ANY (CAST(:ids AS uuid[]))
          AND e.fencing_token = h.token
          AND e.status = 'RUNNING'
          AND e.lease_owner = :owner
          AND e.lease_expires_at > clock_timestamp()
        ORDER BY e.id
        FOR UPDATE OF e
    )
    UPDATE execution AS e
    SET lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
        updated_at = clock_timestamp()
    FROM held
    WHERE e.id = held.id
    RETURNING e.id, e.fencing_token
    """
)

# Expiring the lease at once lets another worker recover the execution without
# waiting out the lease; checkpoints already hold everything it needs.
_RELEASE = text(
    f"""
    UPDATE execution AS e
    SET lease_expires_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE {FENCE}
    RETURNING e.id
    """
)


def renew_leases(
    conn: Connection,
    owner: str,
    held: Iterable[tuple[uuid.UUID, int]],
    lease_seconds: float,
) -> set[tuple[uuid.UUID, int]]:
    """Extend every (execution id, token) lease still held; return those renewed."""
    pairs = list(held)
    if not pairs:
        return set()
    with one_statement(conn):
        rows = conn.execute(
            _RENEW,
            {
                "ids": [execution_id for execution_id, _ in pairs],
                "tokens": [token for _, token in pairs],
                "owner": owner,
                "lease_seconds": float(lease_seconds),
            },
        ).all()
    return {(row.id, row.fencing_token) for row in rows}


def release_lease(conn: Connection, claim: Claim) -> bool:
    """Give the lease back (the execution stays RUNNING for recovery); False if not held."""
    with one_statement(conn):
        return conn.execute(_RELEASE, claim.params).first() is not None
