"""Fire times of cron and period schedules, across daylight-saving changes, and catch-up rounds."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orquestador.db.schema import CATCH_UP_POLICIES as STORED_POLICIES
from orquestador.domain.schedule_times import (
    CATCH_UP_LIMIT,
    CATCH_UP_POLICIES,
    FIRES_PER_ROUND,
    ON_TIME_SECONDS,
    SCAN_LIMIT,
    Timing,
    plan_round,
    timing_problems,
)

MADRID = ZoneInfo("Europe/Madrid")


def _madrid(*parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=MADRID, fold=fold)


def _utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_the_database_and_the_domain_know_the_same_policies() -> None:
    assert STORED_POLICIES == CATCH_UP_POLICIES


@pytest.mark.parametrize(
    ("cron", "every", "zone", "paths"),
    [
        ("*/5 * * * *", None, "Europe/Madrid", []),
        (None, 1, "UTC", []),
        (None, None, "UTC", [""]),
        ("* * * * *", 60, "UTC", [""]),
        ("* * * *", None, "UTC", ["/cron"]),
        ("* * * * * *", None, "UTC", ["/cron"]),
        ("@daily", None, "UTC", ["/cron"]),
        ("61 * * * *", None, "UTC", ["/cron"]),
        ("0 0 30 2 *", None, "UTC", ["/cron"]),
        (None, 0, "UTC", ["/everySeconds"]),
        ("* * * * *", None, "Europe/Atlantis", ["/timezone"]),
        ("* * * * *", None, "../../etc/passwd", ["/timezone"]),
        ("* * * * *", None, "Europe", ["/timezone"]),
        ("* * * * *", None, "posix/Europe/Madrid", ["/timezone"]),
        ("* * * * *", None, "", ["/timezone"]),
        # Names whose time depends on the host (its own zone, its files) or on no place.
        ("* * * * *", None, "localtime", ["/timezone"]),
        ("* * * * *", None, "posixrules", ["/timezone"]),
        ("* * * * *", None, "Factory", ["/timezone"]),
        ("* * * * *", None, "America/Argentina/Buenos_Aires", []),
        ("* * * * *", None, "Etc/GMT+3", []),
    ],
)
def test_timing_problems(cron: str | None, every: int | None, zone: str, paths: list[str]) -> None:
    assert [p.path for p in timing_problems(cron, every, zone)] == paths


def test_a_skipped_wall_clock_time_fires_right_after_the_spring_gap() -> None:
    """Madrid, 29 March 2026: 02:00 becomes 03:00; a daily 02:30 fires at 03:00 that day."""
    timing = Timing("30 2 * * *", None, "Europe/Madrid")
    times = timing.from_fire_time(_madrid(2026, 3, 28, 2, 30).astimezone(UTC))
    fires = [timing.local(next(times)) for _ in range(3)]

    assert fires == [
        _madrid(2026, 3, 28, 2, 30),
        _madrid(2026, 3, 29, 3, 0),
        _madrid(2026, 3, 30, 2, 30),
    ]
    # A calendar day apart; 23.5 hours of real time across the gap.
    assert fires[1].astimezone(UTC) - fires[0].astimezone(UTC) == timedelta(hours=23, minutes=30)
    assert [f.utcoffset() for f in fires] == [timedelta(hours=h) for h in (1, 2, 2)]


def test_a_repeated_wall_clock_time_fires_once_in_the_autumn() -> None:
    """Madrid, 25 October 2026: 03:00 becomes 02:00; 02:30 happens twice, a daily 02:30 once."""
    timing = Timing("30 2 * * *", None, "Europe/Madrid")
    start = _madrid(2026, 10, 24, 2, 30).astimezone(UTC)
    fires = [timing.local(t) for t in _take(timing.from_fire_time(start), 3)]

    assert fires == [
        _madrid(2026, 10, 24, 2, 30),
        _madrid(2026, 10, 25, 2, 30),  # the first 02:30, summer time (+02:00)
        _madrid(2026, 10, 26, 2, 30),
    ]
    assert fires[1].utcoffset() == timedelta(hours=2)


def test_a_daily_time_outside_the_changes_keeps_its_wall_clock_time() -> None:
    timing = Timing("30 1 * * *", None, "Europe/Madrid")
    start = _madrid(2026, 10, 24, 1, 30).astimezone(UTC)
    fires = [timing.local(t) for t in _take(timing.from_fire_time(start), 3)]

    assert [(f.day, f.hour, f.minute) for f in fires] == [(24, 1, 30), (25, 1, 30), (26, 1, 30)]
    # 25 hours of real time between the fires around the change.
    assert fires[1].astimezone(UTC) - fires[0].astimezone(UTC) == timedelta(hours=24)
    assert fires[2].astimezone(UTC) - fires[1].astimezone(UTC) == timedelta(hours=25)


def test_every_half_hour_fires_both_occurrences_of_the_repeated_hour() -> None:
    """A wildcard hour matches both 02:00 and both 02:30 of the autumn night: distinct instants."""
    timing = Timing("*/30 * * * *", None, "Europe/Madrid")
    start = _madrid(2026, 10, 25, 1, 30).astimezone(UTC)
    fires = list(_take(timing.from_fire_time(start), 6))

    assert [f - start for f in fires] == [timedelta(minutes=30 * n) for n in range(6)]


def test_a_period_is_real_time_whatever_the_zone() -> None:
    timing = Timing(None, 3600, "Europe/Madrid")
    start = _madrid(2026, 3, 29, 1, 0).astimezone(UTC)
    fires = [timing.local(t) for t in _take(timing.from_fire_time(start), 3)]

    assert [f.hour for f in fires] == [1, 3, 4]


def test_a_due_fire_on_time_starts_under_every_policy() -> None:
    timing = Timing(None, 60, "UTC")
    due = _utc(2026, 1, 1, 12, 0)
    for policy in CATCH_UP_POLICIES:
        planned = plan_round(timing, policy, due, due + timedelta(seconds=2))
        assert planned.fire == [due]
        assert planned.missed == 0
        assert planned.next_fire_at == due + timedelta(seconds=60)
        assert not planned.more


def test_nothing_due_starts_nothing() -> None:
    timing = Timing("0 * * * *", None, "UTC")
    later = _utc(2026, 1, 1, 13, 0)
    planned = plan_round(timing, "all", later, later - timedelta(minutes=1))
    assert planned.fire == [] and planned.missed == 0 and planned.next_fire_at == later


def test_after_downtime_skip_lets_late_fire_times_go() -> None:
    timing = Timing("0 * * * *", None, "UTC")
    planned = plan_round(timing, "skip", _utc(2026, 1, 1, 8), _utc(2026, 1, 1, 12, 30))

    assert planned.fire == []
    assert planned.missed == 5  # 08:00 to 12:00
    assert planned.next_fire_at == _utc(2026, 1, 1, 13)


def test_after_downtime_skip_still_starts_a_fire_time_that_is_on_time() -> None:
    timing = Timing("0 * * * *", None, "UTC")
    planned = plan_round(timing, "skip", _utc(2026, 1, 1, 8), _utc(2026, 1, 1, 12, 0, 30))

    assert planned.fire == [_utc(2026, 1, 1, 12)]
    assert planned.missed == 4


def test_after_downtime_one_starts_the_latest_only() -> None:
    timing = Timing("0 * * * *", None, "UTC")
    planned = plan_round(timing, "one", _utc(2026, 1, 1, 8), _utc(2026, 1, 1, 12, 30))

    assert planned.fire == [_utc(2026, 1, 1, 12)]
    assert planned.missed == 4
    assert planned.next_fire_at == _utc(2026, 1, 1, 13)


def test_after_downtime_all_starts_each_in_rounds_of_bounded_size() -> None:
    timing = Timing("* * * * *", None, "UTC")
    start, now = _utc(2026, 1, 1, 8), _utc(2026, 1, 1, 8, 45, 30)
    fired: list[datetime] = []
    rounds = 0
    next_fire_at, missed, more = start, 0, True
    while more:
        planned = plan_round(timing, "all", next_fire_at, now)
        assert len(planned.fire) <= FIRES_PER_ROUND
        fired += planned.fire
        missed += planned.missed
        next_fire_at, more = planned.next_fire_at, planned.more
        rounds += 1

    assert fired == [start + timedelta(minutes=n) for n in range(46)]
    assert missed == 0 and rounds == 3
    assert next_fire_at == _utc(2026, 1, 1, 8, 46)


def test_all_is_bounded_to_the_latest_fire_times() -> None:
    timing = Timing(None, 1, "UTC")
    start = _utc(2026, 1, 1)
    now = start + timedelta(days=7)
    planned = plan_round(timing, "all", start, now)

    passed = 7 * 24 * 3600 + 1
    assert planned.missed == passed - CATCH_UP_LIMIT
    assert planned.fire[0] == now - timedelta(seconds=CATCH_UP_LIMIT - 1)
    assert planned.more


def test_a_week_behind_a_minute_cron_is_let_go_in_bounded_rounds() -> None:
    timing = Timing("* * * * *", None, "UTC")
    start = _utc(2026, 1, 1)
    now = start + timedelta(days=7, seconds=30)
    next_fire_at, missed, fired, more, rounds = start, 0, [], True, 0
    while more:
        planned = plan_round(timing, "one", next_fire_at, now)
        missed += planned.missed
        fired += planned.fire
        next_fire_at, more = planned.next_fire_at, planned.more
        rounds += 1

    assert fired == [start + timedelta(days=7)]
    assert missed == 7 * 24 * 60
    assert rounds == -(-(7 * 24 * 60) // (SCAN_LIMIT - CATCH_UP_LIMIT))


def _take(times, n: int) -> list[datetime]:
    return [next(times) for _ in range(n)]


# --- whatever the lag, the rounds together do what the policy says ----------------------

_TIMINGS = st.one_of(
    st.builds(Timing, st.none(), st.integers(1, 7200), st.just("UTC")),
    st.builds(
        Timing,
        st.sampled_from(["*/5 * * * *", "0 * * * *", "30 2 * * *", "*/30 1-3 * * *"]),
        st.none(),
        st.sampled_from(["UTC", "Europe/Madrid", "America/New_York"]),
    ),
)


@settings(max_examples=2 * settings.default.max_examples, deadline=None)
@given(
    timing=_TIMINGS,
    policy=st.sampled_from(CATCH_UP_POLICIES),
    # Around the autumn change in Madrid and New York, up to three days of downtime.
    first_after=st.datetimes(datetime(2026, 10, 23), datetime(2026, 11, 2)),
    lag=st.integers(0, 3 * 24 * 3600),
)
def test_rounds_start_and_miss_every_passed_fire_time_once(
    timing: Timing, policy: str, first_after: datetime, lag: int
) -> None:
    first = timing.first_after(first_after.replace(tzinfo=UTC))
    assert first is not None
    now = first + timedelta(seconds=lag)
    passed = list(itertools.takewhile(lambda t: t <= now, timing.from_fire_time(first)))

    fired: list[datetime] = []
    missed, next_fire_at, more = 0, first, True
    while more:
        planned = plan_round(timing, policy, next_fire_at, now)
        assert len(planned.fire) <= FIRES_PER_ROUND
        fired += planned.fire
        missed += planned.missed
        assert planned.next_fire_at is not None
        next_fire_at, more = planned.next_fire_at, planned.more

    assert fired == sorted(set(fired)) and set(fired) <= set(passed)
    assert len(fired) + missed == len(passed)
    assert next_fire_at > now and next_fire_at == timing.first_after(passed[-1])
    if policy == "all":
        assert fired == passed[-CATCH_UP_LIMIT:]
    elif policy == "one" or (now - passed[-1]).total_seconds() <= ON_TIME_SECONDS:
        assert fired == passed[-1:]
    else:
        assert fired == []
