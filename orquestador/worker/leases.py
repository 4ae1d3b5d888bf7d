"""The leases this process holds, keyed by (execution id, token), with each job's stop signal."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from orquestador.queue import Claim

LeaseKey = tuple[uuid.UUID, int]


@dataclass
class HeldLease:
    claim: Claim
    stop: threading.Event = field(default_factory=threading.Event)
    # Local bound on the lease: if the heartbeat cannot reach the database, the job
    # stops by itself once this passes instead of trusting a lease it cannot renew.
    valid_until: float = 0.0
    # Set when the heartbeat stopped the job because the lease is gone (not at a drain):
    # the daemon counts the loss if the job's own end did not already report it.
    lost: bool = False


class HeldLeases:
    """Thread-safe table of live jobs; a key that left the table can never be signalled again."""

    def __init__(self, lease_seconds: float) -> None:
        self._lease_seconds = lease_seconds
        self._held: dict[LeaseKey, HeldLease] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(claim: Claim) -> LeaseKey:
        return (claim.execution_id, claim.token)

    def add(self, claim: Claim) -> HeldLease:
        held = HeldLease(claim, valid_until=time.monotonic() + self._lease_seconds)
        with self._lock:
            self._held[self.key(claim)] = held
        return held

    def remove(self, claim: Claim) -> HeldLease | None:
        with self._lock:
            return self._held.pop(self.key(claim), None)

    def keys(self) -> list[LeaseKey]:
        with self._lock:
            return list(self._held)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def renewed(self, keys: set[LeaseKey], started: float) -> None:
        # `started` is taken before the statement ran, so the local bound errs early.
        with self._lock:
            for key in keys:
                held = self._held.get(key)
                if held is not None:
                    held.valid_until = started + self._lease_seconds

    def lose(self, key: LeaseKey) -> Claim | None:
        """Signal the job holding exactly this key, if it still runs; return its claim."""
        with self._lock:
            held = self._held.get(key)
        if held is None:
            return None
        held.lost = True
        held.stop.set()
        return held.claim

    def lose_overdue(self, now: float) -> list[Claim]:
        with self._lock:
            overdue = [h for h in self._held.values() if h.valid_until <= now]
        for held in overdue:
            held.lost = True
            held.stop.set()
        return [held.claim for held in overdue]

    def signal_all(self) -> int:
        with self._lock:
            remaining = list(self._held.values())
        for held in remaining:
            held.stop.set()
        return len(remaining)
