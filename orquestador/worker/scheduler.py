"""The scheduler thread: claims only as many executions as there are free executor slots."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping

from sqlalchemy import Engine

from orquestador.backoff import Backoff
from orquestador.loop import Loop
from orquestador.metrics import CLAIM_BATCH_SIZE
from orquestador.queue import Claim
from orquestador.queue.claims import ClaimRound, claim_round
from orquestador.redaction import error_line
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks

log = logging.getLogger(__name__)


class Slots:
    """Free executor capacity; a slot is taken at claim time and given back when the job ends."""

    def __init__(self, capacity: int, wake: threading.Event) -> None:
        self.capacity = capacity
        self._busy = 0
        self._lock = threading.Lock()
        self._wake = wake
        self._idle = threading.Condition(self._lock)

    @property
    def free(self) -> int:
        with self._lock:
            return self.capacity - self._busy

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def take(self, count: int) -> None:
        with self._lock:
            if self._busy + count > self.capacity:
                raise RuntimeError("claimed more executions than free slots")
            self._busy += count

    def give_back(self) -> None:
        with self._lock:
            self._busy -= 1
            self._idle.notify_all()
        self._wake.set()

    def wait_free(self, count: int, timeout: float) -> int:
        """Block until `count` slots are free or `timeout` passes; return the free slots."""
        with self._lock:
            self._idle.wait_for(lambda: self.capacity - self._busy >= count, timeout)
            return self.capacity - self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job runs or `timeout` passes; True when idle."""
        with self._lock:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)


# Claims failing in a row wait at most this long between tries.
CLAIM_BACKOFF_CAP_SECONDS = 30.0
# SQLSTATE of a missing privilege.
INSUFFICIENT_PRIVILEGE = "42501"

# The longest the scheduler waits for more free slots before claiming under a backlog.
GATHER_SECONDS = 0.005


def jittered(seconds: float) -> float:
    # +-20% so that many idle workers do not poll in lockstep.
    return seconds * random.uniform(0.8, 1.2)


class Scheduler(Loop):
    """Claim, commit, hand each claim to a thread; sleep (interruptibly) when nothing is due."""

    def __init__(
        self,
        engine: Engine,
        owner: str,
        *,
        batch: int,
        poll_seconds: float,
        lease_seconds: float,
        slots: Slots,
        org_weights: Mapping[str, float] | None = None,
        submit: Callable[[Claim], None],
        wake: threading.Event,
        hooks: WorkerHooks = NO_HOOKS,
    ) -> None:
        # A claim that keeps failing (database away, a grant missing) is retried ever
        # more slowly, so that the log holds a line per try, not two a second.
        super().__init__(
            "scheduler",
            poll_seconds,
            wake,
            failure_backoff=Backoff(poll_seconds, CLAIM_BACKOFF_CAP_SECONDS),
        )
        self._engine = engine
        self._owner = owner
        self._batch = batch
        self._lease_seconds = lease_seconds
        self._org_weights = dict(org_weights or {})
        self._slots = slots
        self._submit = submit
        self._hooks = hooks
        # Under a backlog, claim once this many slots are free (or GATHER_SECONDS passed).
        self._gather = max(1, min(batch, slots.capacity) // 2)
        self._backlog = False  # the last claim got all it asked for: more is probably due

    def run_once(self) -> bool:
        free = self._slots.free
        if self._backlog and 0 < free < self._gather:
            # Under a backlog, slots free up one job at a time; claiming each alone
            # costs a commit apiece. A few milliseconds' wait lets a batch gather.
            # Nothing is claimed until then, so no claimed work waits for a thread.
            free = self._slots.wait_free(self._gather, GATHER_SECONDS)
        wanted = min(self._batch, free)
        if wanted <= 0:
            return False  # a slot given back sets `wake`
        claimed = self.claim_once(wanted)
        # A claim that blocked executions behind a full concurrency key, or let some
        # back, changed what is due: claim again at once rather than after a poll.
        self._backlog = len(claimed.claims) == wanted or claimed.more_may_be_due
        if not self._backlog and self._hooks.before_idle_wait:
            self._hooks.before_idle_wait()
        return self._backlog

    def idle_seconds(self) -> float:
        return jittered(self.interval_seconds)

    def recovered(self, failures: int) -> None:
        log.info(
            "claiming again after %d failed attempt(s)", failures, extra={"worker_id": self._owner}
        )

    def failed(self, exc: Exception, wait_seconds: float) -> None:
        """Log one line about each failed claim, with the wait before the next."""
        self._backlog = False
        hint = ""
        if getattr(getattr(exc, "orig", None), "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
            hint = (
                " (the runtime role lacks a grant: `orquestador migrate grant` applies them,"
                " `orquestador check` names what is missing)"
            )
        log.warning(
            "claim failed: %s%s; next try in %.1f s",
            error_line(exc),
            hint,
            wait_seconds,
            extra={"worker_id": self._owner},
        )

    def claim_once(self, wanted: int) -> ClaimRound:
        with self._engine.connect() as conn:
            claimed = claim_round(
                conn,
                self._owner,
                limit=wanted,
                lease_seconds=self._lease_seconds,
                org_weights=self._org_weights,
            )
        claims = claimed.claims
        if not claims:
            return claimed
        CLAIM_BATCH_SIZE.observe(len(claims))
        # The slots are taken before anything else can fail, and every claim goes
        # straight to a thread: nothing claimed waits in a local queue.
        self._slots.take(len(claims))
        if self._hooks.after_claim:
            self._hooks.after_claim(claims)
        for claim in claims:
            self._submit(claim)
        return claimed
