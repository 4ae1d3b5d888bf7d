"""Whether a machine's agent is alive: when its polls and reports last showed it, and what
that makes it when read (online, offline past AGENT_OFFLINE_SECONDS, or never seen).

Nothing flips a machine offline: the status is worked out from the last-seen time each
time it is read, so an agent that stops is offline from the moment it has been silent
too long, whoever looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from orquestador.wording import duration_in_words

# A machine's agent is written down as seen at most this often: a fleet polling every
# few seconds costs one write per machine per interval, not one per poll.
SEEN_WRITE_SECONDS = 10

ONLINE, OFFLINE, NEVER_SEEN = "online", "offline", "never seen"

# The row is written only when the last one is older than the interval: a poll within it
# finds the row and writes nothing (the WHERE of DO UPDATE fails).
_SEEN = text(
    f"""
    INSERT INTO machine_agent (org_id, machine_id, last_seen_at)
    VALUES (:org_id, :machine_id, clock_timestamp())
    ON CONFLICT (org_id, machine_id) DO UPDATE SET last_seen_at = clock_timestamp()
    WHERE machine_agent.last_seen_at
          < clock_timestamp() - interval '{SEEN_WRITE_SECONDS} seconds'
    """
)


def record_seen(conn: Connection, *, org_id: str, machine_id: str) -> None:
    """The machine's agent showed itself now (a poll or a report), written at most once
    per SEEN_WRITE_SECONDS."""
    conn.execute(_SEEN, {"org_id": org_id, "machine_id": machine_id})


@dataclass(frozen=True)
class AgentSeen:
    """A machine's agent as read: when it was last seen, and how long before the read."""

    last_seen_at: datetime | None
    seconds_since: float | None
    offline_seconds: float

    @property
    def status(self) -> str:
        if self.seconds_since is None:
            return NEVER_SEEN
        return OFFLINE if self.seconds_since > self.offline_seconds else ONLINE

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "lastSeenAt": None if self.last_seen_at is None else self.last_seen_at.isoformat(),
            "secondsSinceSeen": None if self.seconds_since is None else int(self.seconds_since),
            "words": self.in_words(),
        }

    def in_words(self) -> str:
        """`agent last seen 12 s ago`, `offline: agent last seen 3 min ago`, or never."""
        if self.seconds_since is None:
            return "no agent seen yet"
        seen = f"agent last seen {duration_in_words(int(self.seconds_since))} ago"
        return f"offline: {seen}" if self.status == OFFLINE else seen


# The machines' last-seen times and the database's clock at the read, by machine.
_AGENTS = text(
    """
    SELECT machine_id, last_seen_at,
           extract(epoch FROM clock_timestamp() - last_seen_at) AS seconds_since
    FROM machine_agent
    WHERE org_id = :org_id AND machine_id = ANY(:machine_ids)
    """
)


def agents_seen(
    conn: Connection, *, org_id: str, machine_ids: list[str], offline_seconds: float
) -> dict[str, AgentSeen]:
    """Each machine's agent as seen now; a machine whose agent never showed is absent."""
    if not machine_ids:
        return {}
    rows = conn.execute(_AGENTS, {"org_id": org_id, "machine_ids": sorted(set(machine_ids))})
    return {
        row.machine_id: AgentSeen(row.last_seen_at, float(row.seconds_since), offline_seconds)
        for row in rows
    }


def agent_of(seen: dict[str, AgentSeen], machine_id: str, offline_seconds: float) -> AgentSeen:
    """The machine's agent from `agents_seen`, or one never seen."""
    return seen.get(machine_id) or AgentSeen(None, None, offline_seconds)


# An agent silent for this long is a machine taken out of service, not one that is down:
# the gauge stops counting it (the pages still say it is offline, and since when).
GAUGE_FORGETS_DAYS = 7

_OFFLINE = text(
    f"""
    SELECT count(*) FROM machine_agent
    WHERE last_seen_at < clock_timestamp() - make_interval(secs => :offline_seconds)
      AND last_seen_at >= clock_timestamp() - interval '{GAUGE_FORGETS_DAYS} days'
    """
)


def count_offline(conn: Connection, offline_seconds: float) -> int:
    """Agents silent for longer than `offline_seconds` (but seen within the last
    GAUGE_FORGETS_DAYS), every organization."""
    return int(conn.execute(_OFFLINE, {"offline_seconds": offline_seconds}).scalar_one())
