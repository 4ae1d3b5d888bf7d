"""Named points where tests may step in to force an interleaving; all empty in production."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orquestador.queue import Claim
from orquestador.worker.leases import LeaseKey


@dataclass(frozen=True)
class WorkerHooks:
    """Callables run at fixed points of the protocol; an exception raised by one propagates."""

    after_claim: Callable[[list[Claim]], None] | None = None
    before_adapter: Callable[[Claim, str], None] | None = None
    after_adapter: Callable[[Claim, str], None] | None = None
    # Inside the finish transaction, after its writes and before the fenced final update.
    before_finish_commit: Callable[[Claim], None] | None = None
    after_job: Callable[[Claim, str], None] | None = None
    # The scheduler found nothing (or less than it asked for) and is about to sleep.
    before_idle_wait: Callable[[], None] | None = None
    # A heartbeat round took its snapshot of held leases and is about to renew them.
    before_renew: Callable[[list[LeaseKey]], None] | None = None


NO_HOOKS = WorkerHooks()
