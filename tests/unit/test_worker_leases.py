"""The held-lease table: a late heartbeat answer only ever reaches the job it was about."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from orquestador.queue import Claim
from orquestador.worker.leases import HeldLeases
from orquestador.worker.scheduler import Slots


def _claim(execution_id: uuid.UUID, token: int) -> Claim:
    now = datetime.now(UTC)
    return Claim(execution_id, token, "w1", token, 10, uuid.uuid4(), now, now, now)


def test_a_late_loss_never_signals_a_later_job_on_the_same_execution():
    leases = HeldLeases(30)
    eid = uuid.uuid4()
    first = _claim(eid, 1)
    leases.add(first)
    stale_key = HeldLeases.key(first)
    leases.remove(first)  # the job ended; its pool thread picks up the next claim
    second = leases.add(_claim(eid, 2))
    assert leases.lose(stale_key) is None
    assert not second.stop.is_set()


def test_a_loss_signals_exactly_its_job():
    leases = HeldLeases(30)
    a = leases.add(_claim(uuid.uuid4(), 1))
    b = leases.add(_claim(uuid.uuid4(), 1))
    assert leases.lose(HeldLeases.key(a.claim)) == a.claim
    assert a.stop.is_set() and not b.stop.is_set()


def test_leases_not_renewed_in_time_are_presumed_lost():
    leases = HeldLeases(30)
    held = leases.add(_claim(uuid.uuid4(), 1))
    fresh = leases.add(_claim(uuid.uuid4(), 1))
    leases.renewed({HeldLeases.key(fresh.claim)}, started=1_000_000.0)
    assert leases.lose_overdue(now=held.valid_until + 1) == [held.claim]
    assert held.stop.is_set() and not fresh.stop.is_set()


def test_slots_refuse_more_than_capacity():
    import threading

    import pytest

    slots = Slots(2, threading.Event())
    slots.take(2)
    assert slots.free == 0
    with pytest.raises(RuntimeError):
        slots.take(1)
    slots.give_back()
    assert slots.free == 1
