"""Months ahead and retention of the history (audit_event, action_attempt) by outcome.

Both run as the maintenance leader through the runtime role, which owns no table: the
work is done by migration 0024's SECURITY DEFINER functions, which create only the
history's own monthly partitions and remove only history whose execution ended long
enough ago (never one running, waiting or parked for reconciliation). Since 0029 they
take their arguments within the bounds the owner set at migrate time (db/bounds.py):
a period shorter than the owner's is the owner's, months and batches are capped.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

# MONTHS_AHEAD: the months made ahead of time besides the current one, so a leader that
# is down for weeks still leaves every new row a month of its own (else the DEFAULT
# partition); also the most the owner lets any caller make.
from orquestador.db.bounds import MONTHS_AHEAD
from orquestador.db.schema import HISTORY_PARTITIONS_FUNCTION, HISTORY_PURGE_FUNCTION

_PARTITIONS_AHEAD = text(f"SELECT {HISTORY_PARTITIONS_FUNCTION}(:months)")
_PURGE = text(
    f"SELECT {HISTORY_PURGE_FUNCTION}("
    "make_interval(days => :succeeded), make_interval(days => :failed), :batch)"
)


def make_months_ahead(conn: Connection, months: int = MONTHS_AHEAD) -> int:
    """Create this month's and the next MONTHS' partitions that are missing; how many.

    Idempotent: a month that exists is left alone, so every pass may call it.
    """
    if months < 0:
        raise ValueError("months must not be negative")
    return int(conn.execute(_PARTITIONS_AHEAD, {"months": months}).scalar_one())


def purge_history(conn: Connection, succeeded_days: int, failed_days: int, batch: int) -> int:
    """One bounded round of the history's retention; how many rows it removed.

    A month older than both periods is dropped whole (at most one a table a call) after
    its rows of executions still within their period move to the DEFAULT partition; the
    count holds the month's other rows. Then up to BATCH rows of each table whose
    execution ended SUCCEEDED or CANCELLED more than SUCCEEDED_DAYS ago, or FAILED more
    than FAILED_DAYS ago. Call it again while it returns BATCH or more. A period below
    the owner's floor is the floor, a batch above its most is that most.
    """
    if succeeded_days < 0 or failed_days < 0:
        raise ValueError("retention days must not be negative")
    if batch <= 0:
        raise ValueError("batch must be greater than zero")
    params = {"succeeded": succeeded_days, "failed": failed_days, "batch": batch}
    return int(conn.execute(_PURGE, params).scalar_one())
