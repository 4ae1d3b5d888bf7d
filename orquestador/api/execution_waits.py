"""Waiting over HTTP for an execution to settle: `GET /executions/{id}?waitFor=final&timeout=S`.

A wait holds its request thread, as an agent's long poll does, so waits may hold only
a bounded number of a process's threads (WaitShare): EXECUTION_WAIT_SHARE of them, and
never so many that the agents' long polls and waits together leave no thread to
everything else. A wait beyond its share is answered at once, 429 with Retry-After.

No transaction stays open while it waits: each look is one short read of the
execution's status, and between looks the thread sleeps, a little longer each time (an
execution usually ends within milliseconds; one that waits on a machine or a person
does not need to be looked at four times a second). A wait ends when the execution
settles (ended, parked for a person, or waiting on a person's approval), at its
timeout, or when the process stops; then the caller reads the view as it is.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from orquestador.domain.statuses import FINAL, ExecutionStatus

MAX_WAIT_SECONDS = 30.0
# The first look after the one that found it still moving, and the longest pause between two.
FIRST_LOOK_SECONDS = 0.05
LONGEST_LOOK_SECONDS = 0.5
# What a refused wait is told: a place frees when any wait ends, at most MAX_WAIT_SECONDS on.
WAIT_RETRY_AFTER_SECONDS = 1
WAIT_FOR_FINAL = "final"

# Set when the process stops: every wait answers at once with the view as it is.
_STOPPING = threading.Event()


def settled(status: str, open_approval: object | None) -> bool:
    """Whether the execution will not move again without a person: it ended (SUCCEEDED,
    FAILED, CANCELLED), it is parked for a decision, or it waits on `open_approval` (one
    a person can still decide: open, before its deadline)."""
    if status in FINAL or status == ExecutionStatus.RECONCILIATION_REQUIRED:
        return True
    return status == ExecutionStatus.WAITING and open_approval is not None


class WaitShare:
    """The execution waits this process holds, bounded by a share of its request threads."""

    def __init__(self, share: float, agent_share: float, threads: int) -> None:
        self._share = share
        self._agent_share = agent_share
        self._changed = threading.Condition()
        self._held = 0
        self.limit = self.limit_for(share, agent_share, threads)

    @staticmethod
    def limit_for(share: float, agent_share: float, threads: int) -> int:
        """floor(share * threads), but never so many that the agents' long polls (their
        own share, at least one) and the waits leave no thread to everything else; may be 0."""
        agents = max(1, math.floor(agent_share * threads + 1e-9))
        return max(0, min(math.floor(share * threads + 1e-9), threads - agents - 1))

    def size_for(self, threads: int) -> None:
        """Take the share of the threads the server really runs (serve.py tells)."""
        with self._changed:
            self.limit = self.limit_for(self._share, self._agent_share, threads)

    @property
    def held(self) -> int:
        with self._changed:
            return self._held

    def take(self) -> bool:
        """A place for one wait, if one is free now."""
        with self._changed:
            if self._held >= self.limit:
                return False
            self._held += 1
            self._changed.notify_all()
            return True

    def give_back(self) -> None:
        with self._changed:
            self._held -= 1
            self._changed.notify_all()

    def wait_until_held(self, count: int, timeout: float) -> bool:
        """Whether COUNT waits are held within TIMEOUT (tests synchronise on it)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held >= count, timeout)


def wait_until_settled(
    look: Callable[[], tuple[str, object | None] | None],
    timeout: float,
    *,
    on_look: Callable[[], None] | None = None,
) -> None:
    """Look (status, open approval) until the execution has settled, `look` finds nothing, the
    timeout has passed or the process stops. `on_look` is called after each look that
    found it still moving (tests synchronise on it)."""
    give_up_at = time.monotonic() + timeout
    pause = FIRST_LOOK_SECONDS
    while True:
        found = look()
        if found is None or settled(*found):
            return
        if on_look is not None:
            on_look()
        left = give_up_at - time.monotonic()
        if left <= 0 or _STOPPING.wait(min(pause, left)):
            return
        pause = min(pause * 2, LONGEST_LOOK_SECONDS)


def stop_waits() -> None:
    """End every wait of this process now, and any started from now on (it is stopping)."""
    _STOPPING.set()
