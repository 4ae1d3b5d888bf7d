"""The worker's loop through accepted bulk actions, a chunk of items per round."""

from __future__ import annotations

from sqlalchemy import Engine

from orquestador.loop import Loop
from orquestador.queue.bulk import BulkWalk, ItemHook, act_on_chunk

# An accepted bulk waits at most this long for an idle worker; the look reads a partial
# index of running bulks, so polling this often costs little.
POLL_SECONDS = 1.0
# Items per round, each in a transaction of its own: between rounds the loop checks
# whether the worker is stopping, and a full round goes again at once.
CHUNK_ITEMS = 100


class BulkRunner(Loop):
    """Acts on the items of running bulks; every worker runs one (SKIP LOCKED shares them)."""

    def __init__(
        self,
        engine: Engine,
        *,
        claims_budget: int,
        chunk_items: int = CHUNK_ITEMS,
        interval_seconds: float = POLL_SECONDS,
        on_taken: ItemHook | None = None,
    ) -> None:
        super().__init__("bulk-actions", interval_seconds)
        self.engine = engine
        self.claims_budget = claims_budget
        self.chunk_items = chunk_items
        self.on_taken = on_taken
        self.walk = BulkWalk()

    def run_once(self) -> bool:
        acted = act_on_chunk(
            self.engine,
            self.walk,
            claims_budget=self.claims_budget,
            chunk_items=self.chunk_items,
            stop=self.stopped,
            on_taken=self.on_taken,
        )
        return acted >= self.chunk_items
