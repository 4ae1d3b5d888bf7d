"""The heartbeat thread: renews all held leases in one statement; stops jobs that lost one."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine

from orquestador.queue import renew_leases
from orquestador.redaction import error_line
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from orquestador.worker.leases import HeldLeases

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Every renew interval, extend all leases of this owner that are still valid."""

    def __init__(
        self,
        engine: Engine,
        owner: str,
        leases: HeldLeases,
        lease_seconds: float,
        renew_seconds: float,
        hooks: WorkerHooks = NO_HOOKS,
    ) -> None:
        super().__init__(name="orquestador-heartbeat", daemon=True)
        self._engine = engine
        self._owner = owner
        self._leases = leases
        self._lease_seconds = lease_seconds
        self._renew_seconds = renew_seconds
        self._hooks = hooks
        self.stopped = threading.Event()
        # Cleared while renewals fail: readiness reads it.
        self.healthy = threading.Event()
        self.healthy.set()

    def run(self) -> None:
        while not self.stopped.wait(self._renew_seconds):
            self.beat()

    def beat(self) -> None:
        """One renewal round; public so tests can drive it without waiting."""
        held = self._leases.keys()
        if not held:
            # Nothing to renew is nothing failing: an idle worker is not unready.
            self.healthy.set()
            return
        if self._hooks.before_renew:
            self._hooks.before_renew(held)
        started = time.monotonic()
        try:
            with self._engine.connect() as conn:
                renewal = renew_leases(conn, self._owner, held, self._lease_seconds)
        except Exception as exc:
            self.healthy.clear()
            log.warning(
                "lease renewal failed: %s", error_line(exc), extra={"worker_id": self._owner}
            )
            for claim in self._leases.lose_overdue(time.monotonic()):
                log.warning("lease presumed lost", extra=claim.log_extra)
            return
        self.healthy.set()
        self._leases.renewed(renewal.renewed, started)
        for key in held:
            if key in renewal.busy:
                # Another session holds the row locked: still ours, not extended now. The
                # local bound stops the job if that lasts until its lease would run out.
                continue
            if key not in renewal.renewed:
                # Keyed by (id, token): a job that already ended, or a later job on the
                # same pool thread, is never touched by this late answer.
                lost = self._leases.lose(key)
                if lost is not None:
                    # Also seen when the job committed its outcome during this round.
                    log.info("lease not renewed; stop signal set", extra=lost.log_extra)
        for claim in self._leases.lose_overdue(time.monotonic()):
            log.warning(
                "lease could not be renewed in time; stop signal set", extra=claim.log_extra
            )
