"""Retention of machine commands: final commands past their age are deleted in batches.

The audit rows that recorded what a flow saw of a command are never touched: the
execution page tells a purged command from a current one by the row's absence.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from orquestador.db.schema import FINAL_COMMAND_STATUSES

_FINAL = ", ".join(f"'{status}'" for status in FINAL_COMMAND_STATUSES)

# Oldest first, in a bounded batch; SKIP LOCKED leaves a row an agent is reporting on
# to the next pass. The partial index on finished_at serves the scan (the same list).
_DELETE_FINAL = text(
    f"""
    DELETE FROM machine_command
    WHERE id IN (
        SELECT id FROM machine_command
        WHERE status IN ({_FINAL})
          AND finished_at <= clock_timestamp() - make_interval(days => :days)
        ORDER BY finished_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    """
)


def delete_final_commands(conn: Connection, older_than_days: int, batch: int) -> int:
    """Delete up to `batch` final commands finished at least `older_than_days` ago; how many.

    0 days deletes every final command. Call it again while it returns `batch`.
    """
    if older_than_days < 0:
        raise ValueError("older_than_days must not be negative")
    if batch <= 0:
        raise ValueError("batch must be greater than zero")
    return conn.execute(_DELETE_FINAL, {"days": older_than_days, "batch": batch}).rowcount
