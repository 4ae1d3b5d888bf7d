"""The one backoff: a capped doubling ceiling and its two jitter shapes."""

from __future__ import annotations

import pytest

from orquestador.backoff import Backoff

BACKOFF = Backoff(base_seconds=5, cap_seconds=60)


@pytest.mark.parametrize(
    ("failures", "ceiling"), [(0, 5), (1, 5), (2, 10), (3, 20), (4, 40), (5, 60), (10_000, 60)]
)
def test_the_ceiling_doubles_up_to_the_cap_whatever_the_count(failures, ceiling):
    assert BACKOFF.ceiling(failures) == ceiling


def test_full_jitter_may_retry_at_once_and_never_passes_the_ceiling():
    assert BACKOFF.full_jitter(3, rand=lambda: 0.0) == 0
    assert BACKOFF.full_jitter(3, rand=lambda: 0.5) == 10
    assert all(0 <= BACKOFF.full_jitter(3) <= 20 for _ in range(1000))


def test_equal_jitter_never_retries_sooner_than_half_the_ceiling():
    assert BACKOFF.equal_jitter(1, rand=lambda: 0.0) == 2.5
    assert BACKOFF.equal_jitter(3, rand=lambda: 1.0) == 20
    assert BACKOFF.equal_jitter(10_000, rand=lambda: 0.0) == 30
    assert all(10 <= BACKOFF.equal_jitter(3) <= 20 for _ in range(1000))
