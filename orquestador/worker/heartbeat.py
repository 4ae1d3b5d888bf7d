"""The heartbeat thread: renews all held leases in one statement; stops jobs that lost one."""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine

from orquestador.loop import Loop
from orquestador.queue import renew_leases
from orquestador.redaction import error_line
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from orquestador.worker.leases import HeldLeases

log = logging.getLogger(__name__)


class Heartbeat(Loop):
    """Every renew interval, extend all leases of this owner that are still valid.

    A failed renewal is tried again within the interval (the loop's failure backoff is
    capped at it): a lease is renewed as often when the database blinks as when it does not.
    """

    def __init__(
        self,
        engine: Engine,
        owner: str,
        leases: HeldLeases,
        lease_seconds: float,
        renew_seconds: float,
        hooks: WorkerHooks = NO_HOOKS,
    ) -> None:
        super().__init__("heartbeat", renew_seconds)
        self._engine = engine
        self._owner = owner
        self._leases = leases
        self._lease_seconds = lease_seconds
        self._hooks = hooks

    def beat(self) -> None:
        """One renewal round as the loop runs it, a failure included; tests drive it."""
        self.round()

    def failed(self, exc: Exception, wait_seconds: float) -> None:
        # Every failed renewal is logged: each one brings a lease nearer its end.
        log.warning("lease renewal failed: %s", error_line(exc), extra={"worker_id": self._owner})

    def recovered(self, failures: int) -> None:
        log.info("lease renewal works again", extra={"worker_id": self._owner})

    def run_once(self) -> bool:
        held = self._leases.keys()
        if not held:
            # Nothing to renew is nothing failing: an idle worker is not unready.
            return False
        if self._hooks.before_renew:
            self._hooks.before_renew(held)
        started = time.monotonic()
        try:
            with self._engine.connect() as conn:
                renewal = renew_leases(conn, self._owner, held, self._lease_seconds)
        except Exception:
            for claim in self._leases.lose_overdue(time.monotonic()):
                log.warning("lease presumed lost", extra=claim.log_extra)
            raise
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
        return False
