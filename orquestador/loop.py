"""A long-lived thread that does one thing every interval and survives database outages.

Every background thread of a worker is a `Loop`: the scheduler, the heartbeat, the
ready listener, and the loops `worker.background` lists. A round that fails (the database
restarting, say) is logged and tried again after a capped backoff; it never ends the
process. `stop()` ends a loop at its next wait; the worker joins them all under one
shared budget (`worker.daemon.join_all`).
"""

from __future__ import annotations

import logging
import threading

from orquestador.backoff import Backoff
from orquestador.redaction import error_line

log = logging.getLogger(__name__)

# After failures in a row a loop waits from 0.5 s, doubling up to 10 s (never longer
# than its own interval), never at once (equal jitter: the loops of every worker found
# the same database away).
FAILURE_BACKOFF = Backoff(base_seconds=0.5, cap_seconds=10.0)


class Loop(threading.Thread):
    """Calls `run_once()` every `interval_seconds`, or at once when `wake` is set.

    A failed round waits out `failure_backoff` (by default FAILURE_BACKOFF capped at
    the interval: a failure never puts the next round off longer than success would);
    `stop()` cuts any wait short.
    """

    def __init__(
        self,
        name: str,
        interval_seconds: float,
        wake: threading.Event | None = None,
        *,
        failure_backoff: Backoff | None = None,
    ) -> None:
        super().__init__(name=f"orquestador-{name}", daemon=True)
        self.interval_seconds = interval_seconds
        self.wake = wake or threading.Event()
        self.stopped = threading.Event()
        self.failure_backoff = failure_backoff or Backoff(
            FAILURE_BACKOFF.base_seconds, min(FAILURE_BACKOFF.cap_seconds, interval_seconds)
        )
        self.failures = 0  # rounds failed in a row
        # Cleared while the last round failed: readiness and tests read it.
        self.healthy = threading.Event()
        self.healthy.set()

    def run_once(self) -> bool:
        """One round; True when there may be more to do at once (no wait before the next)."""
        raise NotImplementedError

    def idle_seconds(self) -> float:
        """How long to wait for `wake` after a round with nothing more to do."""
        return self.interval_seconds

    def failed(self, exc: Exception, wait_seconds: float) -> None:
        """Say that a round failed; the first of a run is logged, the rest are not."""
        if self.failures == 1:
            log.warning("%s failed: %s; trying again", self.name, error_line(exc))

    def recovered(self, failures: int) -> None:
        """Say that a round worked again after `failures` failed ones."""
        log.info("%s recovered", self.name)

    def settled(self) -> None:
        """The loop works again: healthy, no failures counted. A round calls it itself
        when it runs long (the listener, once it listens); `round()` after each success."""
        if self.failures:
            self.recovered(self.failures)
        self.failures = 0
        self.healthy.set()

    def round(self) -> float:
        """One round, its failure counted and said; the seconds to wait before the next
        (0: at once). After a success the wait is for `wake`; after a failure, for `stop()`
        alone (`run` tells them apart by `failures`)."""
        # Cleared before the round: a wake that lands during it sets it again, so the
        # next wait returns at once instead of missing the work.
        self.wake.clear()
        try:
            more = self.run_once()
        except Exception as exc:
            self.healthy.clear()
            self.failures += 1
            if self.stopped.is_set():
                return 0.0  # stopping: the database may be going away with us
            wait = self.failure_backoff.equal_jitter(self.failures)
            self.failed(exc, wait)
            return wait
        self.settled()
        return 0.0 if more else self.idle_seconds()

    def run(self) -> None:
        while not self.stopped.is_set():
            wait = self.round()
            if self.stopped.is_set():
                break  # a round that saw `stopped` (the listener's) ends the loop now
            if self.failures:
                self.stopped.wait(wait)
            elif wait:
                self.wake.wait(wait)

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
