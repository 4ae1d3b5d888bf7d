"""Durable waits: an execution parked WAITING on a key runs again when the key is woken."""

from __future__ import annotations

from sqlalchemy import Connection, text

from orquestador.db.schema import EXECUTION_READY_CHANNEL

# Due now: the claim takes a WAITING row once next_attempt_at has passed, so moving it
# to the present is all a wake needs. The row keeps its wait_key until a claim takes it.
_WAKE = text(
    """
    UPDATE execution SET next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE status = 'WAITING' AND wait_key = :wait_key
    """
)

_NOTIFY = text("SELECT pg_notify(:channel, '')")


def wake_waiting(conn: Connection, wait_key: str) -> int:
    """Make every execution waiting on `wait_key` due now; how many there were.

    Runs in the caller's transaction, so the wake commits with the change that caused it
    (a command's new status, say). Workers hear of it through the ready channel once the
    transaction commits; no notification when nothing waits on the key.
    """
    woken = conn.execute(_WAKE, {"wait_key": wait_key}).rowcount
    if woken:
        conn.execute(_NOTIFY, {"channel": EXECUTION_READY_CHANNEL})
    return woken
