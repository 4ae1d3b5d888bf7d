"""The one loop type every background thread of a worker runs on."""

from __future__ import annotations

import threading

import pytest

from orquestador.loop import FAILURE_BACKOFF, Loop
from orquestador.worker.heartbeat import Heartbeat
from orquestador.worker.listener import ReadyListener
from orquestador.worker.scheduler import Scheduler


class Flaky(Loop):
    """Fails while `failing` is set; counts its rounds."""

    def __init__(self, interval_seconds: float) -> None:
        super().__init__("flaky", interval_seconds)
        self.failing = True
        self.rounds = 0
        self.round_ran = threading.Event()

    def run_once(self) -> bool:
        self.rounds += 1
        self.round_ran.set()
        if self.failing:
            raise ConnectionError("the database went away")
        return False


@pytest.mark.parametrize("interval", [0.2, 3.0, 60.0])
def test_a_failure_never_puts_the_next_round_off_longer_than_the_interval(interval):
    loop = Flaky(interval)
    waits = [loop.round() for _ in range(12)]
    assert loop.failures == 12 and not loop.healthy.is_set()
    assert all(0 < wait <= min(interval, FAILURE_BACKOFF.cap_seconds) for wait in waits)


def test_a_round_that_works_again_clears_the_failures_and_waits_the_interval():
    loop = Flaky(5.0)
    loop.round()
    loop.failing = False
    assert loop.round() == 5.0
    assert loop.failures == 0 and loop.healthy.is_set()


def test_stop_ends_a_loop_in_its_long_wait_at_once():
    loop = Flaky(3600.0)
    loop.failing = False
    loop.start()
    assert loop.round_ran.wait(10)
    loop.stop()
    loop.join(5)
    assert not loop.is_alive()


def test_every_background_thread_of_a_worker_is_a_loop():
    assert issubclass(Heartbeat, Loop)
    assert issubclass(Scheduler, Loop)
    assert issubclass(ReadyListener, Loop)
