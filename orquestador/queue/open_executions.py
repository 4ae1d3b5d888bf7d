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

import threading
import time
from collections.abc import Callable

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


# An organization found at least FAR_BELOW under its limit is not counted again by the
# same process for ROOM_SECONDS: to go over in that time it would have to be accepted
# more than FAR_BELOW times a second. Nearer its limit it is counted every time.
FAR_BELOW = 1_000
ROOM_SECONDS = 1.0


class RecentRoom:
    """One process's memory of the organizations found far below their limit.

    The count costs about a millisecond per 10,000 open executions
    (docs/PERFORMANCE.md), so an organization with many is counted at most once a second
    while it is far from its limit, and at every acceptance only near it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def used_if_full(self, connection: Connection, org: str, limit: int) -> int | None:
        """None when the organization may accept one more execution under `limit`, else
        how many it holds (counted no further than the limit)."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get((org, limit))
        if seen is not None and now - seen < ROOM_SECONDS:
            return None
        used = count_open(connection, org, up_to=limit)
        if used + FAR_BELOW <= limit:
            with self._lock:
                self._seen[(org, limit)] = now
        return None if used < limit else used
