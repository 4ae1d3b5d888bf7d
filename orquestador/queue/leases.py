"""Renewing every held lease in one statement, and giving a lease back early."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import Connection, text

from orquestador.domain.statuses import ExecutionStatus
from orquestador.queue.fencing import FENCE, Claim
from orquestador.queue.transactions import one_statement

# One statement for all held leases: the heartbeat's cost does not grow with the
# number of round trips. A row renews only while RUNNING under the exact owner and
# token and while its lease is still valid by database time, so an expired lease
# never comes back to life, even if no one has reclaimed it yet.
#
# The rows are locked first, in id order, as the protocol writer locks the executions
# of a batch (`queue/batches.py`), skipping a row another session holds: one row locked
# by an operator's open transaction must not hold back the renewal of every other
# lease. A skipped row that still holds its fence (as last committed) is busy: neither
# renewed nor lost this round.
_HELD_FENCE = f"""
        e.id = ANY (CAST(:ids AS uuid[]))
          AND e.fencing_token = h.token
          AND e.status = '{ExecutionStatus.RUNNING}'
          AND e.lease_owner = :owner
          AND e.lease_expires_at > clock_timestamp()
"""
_PAIRS = "unnest(CAST(:ids AS uuid[]), CAST(:tokens AS bigint[])) AS h(id, token)"
_RENEW = text(
    f"""
    WITH held AS (
        SELECT e.id
        FROM execution AS e
        JOIN {_PAIRS} ON e.id = h.id
        WHERE {_HELD_FENCE}
        ORDER BY e.id
        FOR UPDATE OF e SKIP LOCKED
    ), renewed AS (
        UPDATE execution AS e
        SET lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
            updated_at = clock_timestamp()
        FROM held
        WHERE e.id = held.id
        RETURNING e.id, e.fencing_token
    )
    SELECT id, fencing_token, true AS renewed FROM renewed
    UNION ALL
    SELECT e.id, e.fencing_token, false
    FROM execution AS e
    JOIN {_PAIRS} ON e.id = h.id
    WHERE {_HELD_FENCE}
      AND e.id NOT IN (SELECT id FROM held)
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


class Renewal(NamedTuple):
    """One renewal round: the (execution id, token) leases extended, and those another
    session held locked (still ours, not extended this round)."""

    renewed: set[tuple[uuid.UUID, int]]
    busy: set[tuple[uuid.UUID, int]]


def renew_leases(
    conn: Connection,
    owner: str,
    held: Iterable[tuple[uuid.UUID, int]],
    lease_seconds: float,
) -> Renewal:
    """Extend every (execution id, token) lease still held and not locked by another."""
    pairs = list(held)
    if not pairs:
        return Renewal(set(), set())
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
    return Renewal(
        {(row.id, row.fencing_token) for row in rows if row.renewed},
        {(row.id, row.fencing_token) for row in rows if not row.renewed},
    )


def release_lease(conn: Connection, claim: Claim) -> bool:
    """Give the lease back (the execution stays RUNNING for recovery); False if not held."""
    with one_statement(conn):
        return conn.execute(_RELEASE, claim.params).first() is not None
