"""The run-wide lock that lets a test marked alone run with no other test beside it."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Callable
from pathlib import Path

from tests.run_alone import turn


def _gate_taken(folder: Path) -> bool:
    with (folder / "gate.lock").open("a") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False


def _until(condition: Callable[[], bool]) -> bool:
    tick = threading.Event()
    for _ in range(1000):
        if condition():
            return True
        tick.wait(0.01)
    return False


def test_an_alone_test_waits_for_the_running_ones_and_keeps_new_ones_out(tmp_path: Path) -> None:
    running = threading.Event()
    finish_running = threading.Event()
    alone_in = threading.Event()
    finish_alone = threading.Event()
    late_in = threading.Event()

    def a_running_test() -> None:
        with turn(tmp_path, alone=False):
            running.set()
            finish_running.wait(10)

    def the_alone_test() -> None:
        with turn(tmp_path, alone=True):
            alone_in.set()
            finish_alone.wait(10)

    def a_later_test() -> None:
        with turn(tmp_path, alone=False):
            late_in.set()

    first = threading.Thread(target=a_running_test)
    first.start()
    assert running.wait(10)
    alone = threading.Thread(target=the_alone_test)
    alone.start()
    # The alone test takes the gate, then waits for the running test to leave the room.
    assert _until(lambda: _gate_taken(tmp_path))
    assert not alone_in.is_set()
    later = threading.Thread(target=a_later_test)
    later.start()
    finish_running.set()
    assert alone_in.wait(10)
    # The alone test holds the gate: the later test does not get in beside it.
    assert not late_in.wait(0.3)
    finish_alone.set()
    assert late_in.wait(10)
    for thread in (first, alone, later):
        thread.join(10)


def test_tests_that_are_not_alone_run_side_by_side(tmp_path: Path) -> None:
    both_in = threading.Barrier(2, timeout=10)

    def a_test() -> None:
        with turn(tmp_path, alone=False):
            both_in.wait()

    threads = [threading.Thread(target=a_test) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not both_in.broken
