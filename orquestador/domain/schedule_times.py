"""When a schedule fires: its fire times, and which of the passed ones a round starts or lets go.

A schedule's timing is a five-field cron expression read in a named time zone (cronsim
evaluates it as cron does across daylight-saving changes: a wall-clock time the spring
change skips fires at the first minute after the gap, and one the autumn change repeats
fires once, at its first occurrence), or a period of whole seconds. Fire times are
instants; they are stored and compared in UTC.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib.resources import files
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from orquestador.errors import Problem

CATCH_UP_SKIP = "skip"
CATCH_UP_ONE = "one"
CATCH_UP_ALL = "all"
CATCH_UP_POLICIES = (CATCH_UP_SKIP, CATCH_UP_ONE, CATCH_UP_ALL)

# A fire time reached more than this long after it passed is late: `skip` lets it go.
ON_TIME_SECONDS = 60
# `all` starts at most this many of the latest passed fire times; older ones are missed.
CATCH_UP_LIMIT = 100
# A round starts at most this many fires of one schedule, so its transaction stays short;
# the next round goes on with the rest at once.
FIRES_PER_ROUND = 20
# A round looks at most this many passed fire times of a cron schedule (long downtime
# under a frequent cron); the ones it lets go are counted and the next round goes on.
SCAN_LIMIT = 10_000
# The longest period: a year of seconds.
MAX_EVERY_SECONDS = 366 * 24 * 3600
MAX_CRON_CHARACTERS = 200
MAX_TIMEZONE_CHARACTERS = 64


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: `cron` in `timezone`, or every `every_seconds`."""

    cron: str | None
    every_seconds: int | None
    timezone: str = "UTC"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def first_after(self, moment: datetime) -> datetime | None:
        """The first fire time strictly after `moment` (for a period: one period after it)."""
        if self.every_seconds is not None:
            return moment + timedelta(seconds=self.every_seconds)
        return next(self._cron_after(moment), None)

    def from_fire_time(self, fire_time: datetime) -> Iterator[datetime]:
        """`fire_time` (itself a fire time), then every fire time after it, in UTC."""
        yield fire_time
        if self.every_seconds is not None:
            period = timedelta(seconds=self.every_seconds)
            for n in itertools.count(1):
                yield fire_time + n * period
        yield from self._cron_after(fire_time)

    def local(self, moment: datetime) -> datetime:
        """The instant on the schedule's wall clock (what the request data says)."""
        return moment.astimezone(self.zone)

    def _cron_after(self, moment: datetime) -> Iterator[datetime]:
        assert self.cron is not None
        try:
            for found in CronSim(self.cron, moment.astimezone(self.zone)):
                yield found.astimezone(UTC)
        except StopIteration:  # cronsim gives up after 50 years without a match
            return


def timing_problems(cron: str | None, every_seconds: int | None, timezone: str) -> list[Problem]:
    """Why a schedule's timing cannot be used (exactly one of cron and everySeconds)."""
    problems: list[Problem] = []
    if (cron is None) == (every_seconds is None):
        problems.append(Problem("", "give exactly one of cron and everySeconds"))
    if cron is not None:
        problem = cron_problem(cron)
        if problem is not None:
            problems.append(Problem("/cron", problem))
    if every_seconds is not None and not 1 <= every_seconds <= MAX_EVERY_SECONDS:
        problems.append(Problem("/everySeconds", f"from 1 to {MAX_EVERY_SECONDS} seconds"))
    problem = timezone_problem(timezone)
    if problem is not None:
        problems.append(Problem("/timezone", problem))
    return problems


# How many of a cron's next fire times its smallest gap is looked for in: a day of
# minutes and more, enough to meet any pattern of hours within a day and a DST change.
GAP_FIRES_LOOKED_AT = 1500


def pace_problem(timing: Timing, min_seconds: int, now: datetime) -> Problem | None:
    """Why the timing fires more often than the organization's scheduleMinSeconds allows:
    a period below it, or a cron whose smallest gap over its next fire times is."""
    if min_seconds <= 1:
        return None
    said = f"fires more often than every {min_seconds} s (the quota scheduleMinSeconds)"
    if timing.every_seconds is not None:
        if timing.every_seconds < min_seconds:
            return Problem("/everySeconds", said)
        return None
    # A cron fires at most once a minute: no gap below a minimum of a minute or less.
    if min_seconds <= 60:
        return None
    times = list(itertools.islice(timing._cron_after(now), GAP_FIRES_LOOKED_AT))
    gaps = (later - earlier for earlier, later in itertools.pairwise(times))
    if any(gap < timedelta(seconds=min_seconds) for gap in gaps):
        return Problem("/cron", said)
    return None


def cron_problem(cron: str) -> str | None:
    """Why a cron expression is refused: five fields (minute hour day month weekday) only."""
    if len(cron) > MAX_CRON_CHARACTERS:
        return f"a cron expression has at most {MAX_CRON_CHARACTERS} characters"
    fields = cron.split()
    if len(fields) != 5:
        return (
            f"a cron expression has five fields (minute hour day month weekday), not {len(fields)}"
        )
    try:
        found = next(iter(CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))), None)
    except CronSimError as error:
        return f"not a cron expression: {str(error).lower()}"
    except StopIteration:
        found = None
    if found is None:
        return "the expression never fires"
    return None


# In the IANA list but no place's time: "Factory" names no offset anyone keeps.
_NOT_A_PLACE = frozenset({"Factory"})


@cache
def _zone_names() -> frozenset[str]:
    """The IANA zones the tzdata package ships: the same list on every host.

    Not `available_timezones()`, which also lists the host's own files: `localtime` (the
    server's zone, whatever it is set to) or `posixrules`, so that a schedule would fire
    at another time on another server.
    """
    shipped = files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(shipped) - _NOT_A_PLACE


def timezone_problem(timezone: str) -> str | None:
    """Why a time zone name is refused: only the IANA names tzdata lists are taken.

    A list, not a look-up by name, so that no caller's text ever names a file to open.
    """
    if timezone in _zone_names():
        return None
    if not timezone or len(timezone) > MAX_TIMEZONE_CHARACTERS or not timezone.isprintable():
        return "not a time zone name"
    return f"unknown time zone {timezone!r} (an IANA name such as 'Europe/Madrid')"


@dataclass(frozen=True)
class Round:
    """What one firing round does to a due schedule."""

    # The fire times to start now, oldest first.
    fire: list[datetime]
    # How many passed fire times this round lets go without an execution.
    missed: int
    # The first fire time not handled by this round (None: the cron never fires again).
    next_fire_at: datetime | None
    # Whether that fire time has passed already (the next round goes on at once).
    more: bool


def plan_round(timing: Timing, catch_up: str, next_fire_at: datetime, now: datetime) -> Round:
    """Which of the fire times from `next_fire_at` up to `now` to start, under `catch_up`.

    `skip` starts the latest passed fire time only while it is on time (reached within
    ON_TIME_SECONDS), `one` starts the latest whatever its lateness, `all` starts every
    one of the latest CATCH_UP_LIMIT, oldest first, FIRES_PER_ROUND at a time; every
    other passed fire time is missed.
    """
    start, missed = next_fire_at, 0
    if timing.every_seconds is not None and next_fire_at <= now:
        # A period's passed fire times are counted, not walked: a week of seconds is
        # 604,800 of them.
        period = timedelta(seconds=timing.every_seconds)
        passed = (now - next_fire_at) // period + 1
        if passed > CATCH_UP_LIMIT:
            missed = passed - CATCH_UP_LIMIT
            start = next_fire_at + missed * period
    times = timing.from_fire_time(start)
    due = list(itertools.islice(itertools.takewhile(lambda t: t <= now, times), SCAN_LIMIT + 1))
    if len(due) > SCAN_LIMIT:
        # Far behind a frequent cron: these are older than the latest CATCH_UP_LIMIT for
        # sure; let them go and look again from where they end.
        gone = SCAN_LIMIT - CATCH_UP_LIMIT
        return Round(fire=[], missed=missed + gone, next_fire_at=due[gone], more=True)
    if not due:
        return Round(fire=[], missed=missed, next_fire_at=start, more=False)
    following = timing.first_after(due[-1])
    if catch_up == CATCH_UP_ALL:
        kept = due[-CATCH_UP_LIMIT:]
        missed += len(due) - len(kept)
        fire = kept[:FIRES_PER_ROUND]
        if len(kept) > FIRES_PER_ROUND:
            return Round(fire=fire, missed=missed, next_fire_at=kept[FIRES_PER_ROUND], more=True)
    elif catch_up == CATCH_UP_ONE or (now - due[-1]).total_seconds() <= ON_TIME_SECONDS:
        fire = due[-1:]
        missed += len(due) - 1
    else:
        fire = []
        missed += len(due)
    more = following is not None and following <= now
    return Round(fire=fire, missed=missed, next_fire_at=following, more=more)
