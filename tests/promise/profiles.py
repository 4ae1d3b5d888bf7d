"""How much a run does: the suite's short profile, and longer ones by the minute."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """The size of a run; with the seed it fixes the whole schedule."""

    name: str
    fault_seconds: float  # how long faults are injected
    workers: int  # worker processes
    cases: int  # manual requests started during the fault phase
    kills: int  # kill -9 of a worker
    restarts: int  # PostgreSQL restarts (immediate shutdown)
    cancels: int
    decisions: int  # operator decisions on parked executions
    locks: int  # a stranger session holding FOR UPDATE on a row
    events: int  # platform events that start a flow
    poison: int  # platform events that cannot be processed
    quiet_seconds: float  # the most the quiet phase waits for everything to end or park
    clean_share: float = 0.4  # share of cases drawn with no fault at all
    machines: int = 4  # reboots sent and waited for, their agents coming early or late
    pauses: int = 0  # a worker frozen (SIGSTOP) past its lease, then woken (SIGCONT)
    frozen: int = 0  # cases whose worker freezes the instant before its charge is sent
    keyed: int = 0  # cases that take turns on a slot (a concurrency key)
    corrections: int = 0  # retries of a parked keyed case with a correction (key or not)
    deciders: int = 0  # two operators deciding one park at once
    bulks: int = 0  # a bulk retry against a single retry of one park
    approvals: int = 0  # approvals decided near their deadline, most with a cancel racing
    schedules: int = 0  # schedules firing every few seconds
    schedule_seconds: int = 3  # the least interval between a schedule's fires (up to +2)
    rollouts: int = 0  # rollouts of a checkout over a few items
    running_cancels: int = 0  # cancels of executions while a step runs

    def replay(self, seed: int) -> str:
        """The command that runs this profile with this seed again."""
        if self.name == SHORT.name:
            return f"python -m tests.promise --seed {seed} --short"
        minutes = self.fault_seconds / 60
        return (
            f"python -m tests.promise --seed {seed} --minutes {minutes:g} --workers {self.workers}"
        )


SHORT = Profile(
    name="short",
    fault_seconds=24,
    workers=2,
    cases=18,
    kills=1,
    restarts=1,
    cancels=3,
    decisions=3,
    locks=2,
    events=3,
    poison=2,
    quiet_seconds=40,
    pauses=1,
    frozen=1,
    keyed=2,
    corrections=2,
    deciders=1,
    bulks=1,
    approvals=2,
    schedules=1,
    rollouts=1,
    running_cancels=2,
)


def for_minutes(minutes: float, workers: int = 3) -> Profile:
    """A longer run: the same mix, scaled to `minutes` of faults."""
    seconds = minutes * 60
    return Profile(
        name=f"{minutes:g} minutes",
        fault_seconds=seconds,
        workers=workers,
        cases=max(10, int(seconds * 0.8)),
        kills=max(1, int(seconds / 15)),
        restarts=max(1, int(seconds / 90)),
        cancels=max(2, int(seconds / 8)),
        decisions=max(2, int(seconds / 8)),
        locks=max(1, int(seconds / 12)),
        events=max(2, int(seconds / 10)),
        poison=max(2, int(seconds / 30)),
        quiet_seconds=90,
        machines=max(4, int(seconds / 6)),
        pauses=max(1, int(seconds / 40)),
        frozen=max(1, int(seconds / 60)),
        # What the newer features add stays light beside the cases: the writes' route is
        # rate limited for all, and a crowded run blurs the timing checks (6, 8).
        keyed=max(4, int(seconds / 10)),
        corrections=max(2, int(seconds / 30)),
        deciders=max(1, int(seconds / 60)),
        bulks=max(1, int(seconds / 60)),
        approvals=max(2, int(seconds / 30)),
        schedules=1,
        schedule_seconds=6,
        rollouts=max(1, int(seconds / 120)),
        running_cancels=max(2, int(seconds / 20)),
    )
