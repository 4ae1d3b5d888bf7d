"""An adapter's answer counts only when it came before the deadline its context showed."""

from __future__ import annotations

import threading
import time

import pytest

from orquestador.worker.calls import AdapterCalls, CallTimedOut


@pytest.fixture
def calls() -> AdapterCalls:
    return AdapterCalls(keep_idle=2)


def test_an_answer_in_time_is_the_result(calls: AdapterCalls) -> None:
    assert calls.call(lambda x: x + 1, 41, time.monotonic() + 5) == 42


def test_an_answer_given_once_the_deadline_passed_is_dropped_though_nobody_gave_up_yet(
    calls: AdapterCalls,
) -> None:
    # A cooperative adapter returns as soon as should_stop() turns true; the job may not
    # have stopped waiting yet. That answer is late: it is dropped, the call timed out.
    deadline = time.monotonic() + 0.05
    returned = threading.Event()

    def returns_at_its_deadline(_: object) -> str:
        while time.monotonic() < deadline:
            time.sleep(0.001)
        returned.set()
        return "partial"

    with pytest.raises(CallTimedOut):
        calls.call(returns_at_its_deadline, None, deadline, key="k")
    assert returned.wait(5)
    lingering = calls.lingering("k")
    assert lingering is None or lingering.ended(5)  # its thread has returned, or will


def test_a_call_still_running_at_its_deadline_is_abandoned_and_lingers(
    calls: AdapterCalls,
) -> None:
    release = threading.Event()
    with pytest.raises(CallTimedOut):
        calls.call(lambda _: release.wait(5), None, time.monotonic() + 0.05, key="k")
    lingering = calls.lingering("k")
    assert lingering is not None and not lingering.ended(0)
    release.set()
    assert lingering.ended(5)


def test_an_inline_call_in_time_runs_on_the_callers_thread(calls: AdapterCalls) -> None:
    caller = threading.current_thread()
    assert calls.inline(
        lambda x: (x + 1, threading.current_thread()), 41, time.monotonic() + 5
    ) == (
        42,
        caller,
    )


def test_an_inline_answer_given_at_or_past_its_deadline_is_late(calls: AdapterCalls) -> None:
    deadline = time.monotonic() + 0.05

    def returns_at_its_deadline(_: object) -> str:
        while time.monotonic() < deadline:
            time.sleep(0.001)
        return "partial"

    with pytest.raises(CallTimedOut):
        calls.inline(returns_at_its_deadline, None, deadline)


def test_an_inline_error_is_the_adapters_in_time_and_a_timeout_once_late(
    calls: AdapterCalls,
) -> None:
    def fails(_: object) -> str:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        calls.inline(fails, None, time.monotonic() + 5)
    with pytest.raises(CallTimedOut):
        calls.inline(fails, None, time.monotonic() - 1)
