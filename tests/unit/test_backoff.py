"""Retry delays: exponential ceiling, full jitter, bounded Retry-After."""

from __future__ import annotations

import pytest

from orquestador.worker.backoff import RetryPolicy

POLICY = RetryPolicy(
    base_seconds=1, cap_seconds=30, retry_after_min_seconds=2, retry_after_max_seconds=60
)


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (10_000, 30), (0, 1)]
)
def test_ceiling_doubles_up_to_the_cap(attempt, ceiling):
    assert POLICY.ceiling(attempt) == ceiling


def test_full_jitter_spans_zero_to_the_ceiling():
    assert POLICY.delay(4, rand=lambda: 0.0) == 0
    assert POLICY.delay(4, rand=lambda: 0.5) == 4
    assert POLICY.delay(4, rand=lambda: 0.999999) == pytest.approx(8, rel=1e-5)


def test_real_randomness_stays_in_the_window():
    assert all(0 <= POLICY.delay(3) <= 4 for _ in range(1000))


@pytest.mark.parametrize(("retry_after", "expected"), [(0, 2), (5, 5), (3600, 60), (-1, 2)])
def test_retry_after_wins_but_is_clamped(retry_after, expected):
    assert POLICY.delay(1, retry_after=retry_after, rand=lambda: 0.0) == expected
