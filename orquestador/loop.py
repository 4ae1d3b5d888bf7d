"""A long-lived thread that does one thing every interval and survives database outages.

A loop that fails (the database restarting, say) logs one line and tries again after a
capped backoff; it never ends the process. `worker.background` lists the loops a worker
runs.
"""

from __future__ import annotations

import logging
import threading

from orquestador.backoff import Backoff
from orquestador.redaction import error_line

log = logging.getLogger(__name__)

# After failures in a row a loop waits from 0.5 s, doubling up to 10 s, never at once
# (equal jitter: the loops of every worker found the same database away).
FAILURE_BACKOFF = Backoff(base_seconds=0.5, cap_seconds=10.0)


class Loop(threading.Thread):
    """Calls `run_once()` every `interval_seconds`, or at once when `wake` is set."""

    def __init__(
        self,
        name: str,
        interval_seconds: float,
        wake: threading.Event | None = None,
    ) -> None:
        super().__init__(name=f"orquestador-{name}", daemon=True)
        self.interval_seconds = interval_seconds
        self.wake = wake or threading.Event()
        self.stopped = threading.Event()
        # Cleared while the last round failed: readiness and tests read it.
        self.healthy = threading.Event()
        self.healthy.set()

    def run_once(self) -> bool:
        """One round; True when there may be more to do at once (no wait before the next)."""
        raise NotImplementedError

    def run(self) -> None:
        failures = 0  # rounds failed in a row
        while not self.stopped.is_set():
            try:
                more = self.run_once()
            except Exception as exc:
                if self.healthy.is_set():
                    log.warning("%s failed: %s; trying again", self.name, error_line(exc))
                self.healthy.clear()
                failures += 1
                self.stopped.wait(FAILURE_BACKOFF.equal_jitter(failures))
                continue
            if not self.healthy.is_set():
                log.info("%s recovered", self.name)
            self.healthy.set()
            failures = 0
            if more:
                continue
            self.wake.wait(self.interval_seconds)
            self.wake.clear()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
