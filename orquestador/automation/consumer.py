"""The worker's consumer of platform_event rows the platform inserted itself (its outbox)."""

from __future__ import annotations

from sqlalchemy import Engine

from orquestador.automation.events import Actor, claim_unprocessed, process_or_reject
from orquestador.loop import Loop

# An inserted event waits at most this long for an idle consumer; the query behind a
# round reads a partial index of unprocessed rows, so polling this often costs little.
POLL_SECONDS = 1.0
BATCH_SIZE = 50


def consume_platform_events(
    engine: Engine, *, max_attempts: int, batch_size: int = BATCH_SIZE
) -> int:
    """Process one batch of unprocessed events in one transaction; return how many.

    Rows other consumers (or POST /events) hold are skipped, so workers share the
    backlog without waiting on each other. Each event runs in a savepoint: one that
    cannot be processed (its data unreadable, the database refusing its request, any
    unexpected failure) is recorded REJECTED with why in this same round instead of
    blocking the rest forever. A passing database failure (the connection lost) fails
    the round, and every event of it is taken again by the next.
    """
    with engine.begin() as connection:
        events = claim_unprocessed(connection, batch_size)
        for event in events:
            actor = Actor.platform(event.org_id)
            process_or_reject(connection, event, actor, max_attempts=max_attempts)
    return len(events)


class PlatformEventConsumer(Loop):
    """Turns each unprocessed platform_event row into its request and execution, once."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_attempts: int,
        interval_seconds: float = POLL_SECONDS,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        super().__init__("platform-events", interval_seconds)
        self.engine = engine
        self.max_attempts = max_attempts
        self.batch_size = batch_size

    def run_once(self) -> bool:
        handled = consume_platform_events(
            self.engine, max_attempts=self.max_attempts, batch_size=self.batch_size
        )
        # A full batch may leave more behind: go again at once.
        return handled == self.batch_size
