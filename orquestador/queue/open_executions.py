"""The quota openExecutions: how many of an organization's executions have not ended.

Counted at each acceptance from the partial index `ix_execution_open` (migration 0033),
and only up to the limit: the count stops there, so an organization far below its limit
costs a short index read and one at its limit at most `limit` index entries.

No lock: the count is a READ COMMITTED read, so acceptances running at the same moment
do not see each other's uncommitted executions, and each may take the last place. An
organization can go over its limit by at most the number of acceptances it has running
at once (API threads, firing workers, rollout steps), never by more; it then accepts
nothing until enough have ended. A lock per organization would make the limit exact but
put every acceptance of the organization in one line, for a limit meant to stop floods.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from orquestador.db.schema import OPEN_EXECUTION

# Up to :limit of the organization's open executions, from the partial index alone.
_COUNT_OPEN = text(
    f"""
    SELECT count(*) FROM (
        SELECT 1 FROM execution
        WHERE org_id = :org AND {OPEN_EXECUTION}
        LIMIT :limit
    ) AS open_executions
    """
)


def count_open(connection: Connection, org: str, *, up_to: int) -> int:
    """The organization's open executions, counted no further than `up_to`."""
    return int(connection.execute(_COUNT_OPEN, {"org": org, "limit": up_to}).scalar_one())


def has_room(connection: Connection, org: str, limit: int) -> bool:
    """True when the organization may accept one more execution under `limit`."""
    return limit > 0 and count_open(connection, org, up_to=limit) < limit
