"""The fault schedule: every case, fault and timed action of a run, drawn up front from the seed.

Nothing random happens after `draw`: the cases (which flow, which fault on which call
of which step), the moments of kills, the restart, cancels, operator decisions, held
locks and platform events all come from `random.Random` streams seeded with the seed.
Each kind of thing draws from its own stream, so a profile with more kills does not
reshuffle the faults of the cases.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.acceptance.provider_double import (
    BAD_OUTPUT,
    CUT_AFTER,
    CUT_BEFORE,
    NOT_READY,
    OK,
    PERMANENT,
    TRANSIENT,
    UNKNOWN,
    Instruction,
)
from tests.promise.adapters import MAX_ATTEMPTS, READ
from tests.promise.flows import (
    APPROVAL_FLOW,
    EVENT_FLOW,
    KEYED_FLOW,
    MACHINE_FLOW,
    MANUAL_FLOWS,
    ROLLOUT_CHILD_FLOW,
    ROLLOUT_FLOW,
    SLOTS,
    all_steps,
)
from tests.promise.profiles import Profile

# What one call of a step may meet (the provider double plays it).
CALL_FAULTS: dict[str, str] = {
    "transient": "503 at once: safe to retry",
    "transient_later": "503 with Retry-After",
    "permanent": "422: a declared failure, the step's error exit",
    "cut_before": "connection cut before anything was performed",
    "cut_after": "connection cut after the write was performed",
    "late_write": "the write is performed after the adapter's deadline, answered later",
    "slow_nothing": "no answer by the deadline, and nothing performed",
    "slow_read": "a read answered after the deadline",
    "slow_ok": "answered slowly, within the deadline",
    "bad_output": "performed, answered with an output that breaks the schema",
    "not_ready": "a read says: not ready, ask again (WAITING)",
}
# What one look-up may meet; otherwise it answers the truth at once (Found or NotFound).
LOOKUP_FAULTS: dict[str, str] = {
    "unknown": "the provider cannot tell (Unknown)",
    "slow_lookup": "the truth, after the look-up's timeout",
}
WRITE_WEIGHTS = {
    "transient": 3,
    "transient_later": 2,
    "permanent": 1,
    "cut_before": 2,
    "cut_after": 3,
    "late_write": 4,
    "slow_nothing": 2,
    "bad_output": 0.5,
}
READ_WEIGHTS = {
    "transient": 3,
    "transient_later": 1,
    "permanent": 1,
    "cut_before": 2,
    "slow_read": 2,
    "not_ready": 3,
}
POISON_KINDS = ("deep", "nul", "huge")
# A pause outlasts the lease (4 s) and stays within a call's timeout plus the abandon
# grace (1 + 10 s), with room for a starved machine's slow wake: SPEC 25's window that
# remains (a pause past that, between the last check and the send) is out of reach.
PAUSE_MIN_SECONDS = 4.6
PAUSE_MAX_SECONDS = 6.4


@dataclass(frozen=True)
class Fault:
    """One planned fault (a kind of CALL_FAULTS or LOOKUP_FAULTS) and its moments."""

    kind: str
    perform_at: float = 0.0
    answer_at: float = 0.0
    retry_after: float | None = None
    check_again_in: float = 1.0

    def instruction(self) -> Instruction:
        outcome = {
            "ok": OK,
            "transient": TRANSIENT,
            "transient_later": TRANSIENT,
            "permanent": PERMANENT,
            "cut_before": CUT_BEFORE,
            "cut_after": CUT_AFTER,
            "late_write": OK,
            "slow_nothing": TRANSIENT,
            "slow_read": OK,
            "slow_ok": OK,
            "bad_output": BAD_OUTPUT,
            "not_ready": NOT_READY,
            "unknown": UNKNOWN,
            "slow_lookup": OK,
        }[self.kind]
        return Instruction(
            outcome, self.perform_at, self.answer_at, self.retry_after, self.check_again_in
        )


@dataclass(frozen=True)
class Case:
    """One request the run starts (by the API, or by a platform event) and its faults."""

    name: str
    flow: str
    # step id -> the faults of its 1st, 2nd, ... call; and of its look-ups. Past the
    # end of a list (or a None in it) the provider answers plainly.
    calls: dict[str, list[Fault | None]] = field(default_factory=dict)
    lookups: dict[str, list[Fault | None]] = field(default_factory=dict)
    # More request data: a machine case's wait `deadline`, a keyed case's `slot`, an
    # approval case's `approvalSeconds`.
    data: dict[str, Any] = field(default_factory=dict)
    # step id -> seconds its worker freezes right before its first call's request leaves.
    pauses: dict[str, float] = field(default_factory=dict)

    def fault(self, step: str, lookup: bool, ordinal: int) -> Fault | None:
        planned = (self.lookups if lookup else self.calls).get(step, [])
        return planned[ordinal - 1] if ordinal <= len(planned) else None


# --- timed actions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Start the case's request and accept its transition through the API."""

    at: float
    case: str


@dataclass(frozen=True)
class Kill:
    """kill -9 a worker (the one in `slot`, or one with a call in flight) and replace it."""

    at: float
    slot: int
    mid_call: bool


@dataclass(frozen=True)
class Restart:
    """Stop PostgreSQL (immediate) and start it again after `outage` seconds."""

    at: float
    outage: float


@dataclass(frozen=True)
class Cancel:
    """From `at`, cancel the case's execution as soon as it is cancellable.

    With `after_write`, only once it waits (RETRY_WAIT or WAITING), which in the
    provision flow is after its first write: the cancel meets a write done.
    """

    at: float
    case: str
    after_write: bool = False
    # Only once it runs (a step in flight): the cancel must be requested, never refused.
    running: bool = False


@dataclass(frozen=True)
class Decide:
    """An operator settles the oldest parked execution, by the provider's records."""

    at: float
    prefer: str  # retry | fail, when the records show no write


@dataclass(frozen=True)
class Lock:
    """Once the case's execution runs, a stranger holds FOR UPDATE on its request or its row."""

    at: float
    case: str
    table: str  # request | execution
    hold: float


@dataclass(frozen=True)
class AgentComes:
    """The machine's agent starts polling for its command at `at`, for `patience` seconds.

    Given the command, it reports running and, `runs_for` seconds later, succeeded. It
    comes before the case's wait deadline or after it: after, it must be handed nothing.
    """

    at: float
    case: str
    patience: float
    runs_for: float


@dataclass(frozen=True)
class Pause:
    """SIGSTOP a worker (the slot's, or one with a call in flight), SIGCONT it `seconds`
    later: longer than its lease, shorter than a call's timeout plus the abandon grace."""

    at: float
    slot: int
    mid_call: bool
    seconds: float


@dataclass(frozen=True)
class Correct:
    """An operator retries the case's park with a correction: of its concurrency key
    (`slot`, moved to `to_slot`, which two other executions are busy on) or of a field
    that is no key (`note`). A correction the product refuses is retried without it."""

    at: float
    case: str
    to_slot: str | None
    # Started on `to_slot` once the case is parked; the correction comes once one runs.
    companions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Race:
    """Two operators on the case's park at once: two deciders (`deciders`), or a bulk
    retry matching the park and a single retry (`bulk`) whose re-run parks again before
    the bulk's item is taken (a stranger holds the item until then)."""

    at: float
    case: str
    kind: str


@dataclass(frozen=True)
class Approve:
    """From `at`, once the case's approval is asked, an approver decides it `offset`
    seconds from its deadline (before it when negative) and, when `cancel` is given, an
    operator cancels the execution `cancel` seconds from the decision."""

    at: float
    case: str
    decision: str
    offset: float
    cancel: float | None


@dataclass(frozen=True)
class PutSchedule:
    """A schedule fires the case's flow every `every` seconds (catch-up `all`) until the
    fault phase ends, then is paused."""

    at: float
    case: str
    every: int


@dataclass(frozen=True)
class Event:
    """The platform inserts an event row; `kind` is good or a poison (deep, nul, huge)."""

    at: float
    name: str
    kind: str


Action = (
    Submit
    | Kill
    | Restart
    | Cancel
    | Decide
    | Lock
    | Event
    | AgentComes
    | Pause
    | Correct
    | Race
    | Approve
    | PutSchedule
)


@dataclass(frozen=True)
class Schedule:
    seed: int
    profile: Profile
    cases: dict[str, Case]
    actions: list[Action]

    def fault(self, case: str, step: str, lookup: bool, ordinal: int) -> Fault | None:
        planned = self.cases.get(case)
        return planned.fault(step, lookup, ordinal) if planned else None

    def to_json(self) -> str:
        return json.dumps(
            {
                "seed": self.seed,
                "profile": asdict(self.profile),
                "cases": [asdict(case) for case in self.cases.values()],
                "actions": [{"action": type(a).__name__, **asdict(a)} for a in self.actions],
            },
            indent=1,
        )

    def summary(self) -> list[str]:
        """A few lines: what the schedule holds, by kind."""
        faults: Counter[str] = Counter()
        for case in self.cases.values():
            for planned in (*case.calls.values(), *case.lookups.values()):
                faults.update(f.kind for f in planned if f is not None)
        flows = Counter(case.flow for case in self.cases.values())
        actions = Counter(type(a).__name__ for a in self.actions)
        poison = Counter(a.kind for a in self.actions if isinstance(a, Event))
        return [
            "cases: " + ", ".join(f"{n} {flow}" for flow, n in sorted(flows.items())),
            "faults: " + ", ".join(f"{n} {kind}" for kind, n in sorted(faults.items())),
            "actions: " + ", ".join(f"{n} {kind}" for kind, n in sorted(actions.items())),
            "events: " + ", ".join(f"{n} {kind}" for kind, n in sorted(poison.items())),
        ]


# --- drawing -----------------------------------------------------------------------------


def draw(seed: int, profile: Profile) -> Schedule:
    """The whole run's plan for this seed and profile; the same every time."""
    length = profile.fault_seconds
    streams = _Streams(seed)
    cases: dict[str, Case] = {}
    actions: list[Action] = []

    submit_rng = streams.of("submits")
    moments = sorted(submit_rng.uniform(0, 0.6 * length) for _ in range(profile.cases))
    for number, at in enumerate(moments):
        flow = streams.of("flows").choices(MANUAL_FLOWS, weights=(40, 15, 30, 15))[0]
        case = _draw_case(streams.of(f"case:{number}"), f"c{number:03d}", flow, profile)
        cases[case.name] = case
        actions.append(Submit(round(at, 3), case.name))

    rng = streams.of("kills")
    for _ in range(profile.kills):
        at = rng.uniform(0.15 * length, 0.85 * length)
        actions.append(Kill(round(at, 3), rng.randrange(profile.workers), rng.random() < 0.6))

    rng = streams.of("restarts")
    for number in range(profile.restarts):
        span = length / profile.restarts
        at = span * number + rng.uniform(0.35 * span, 0.65 * span)
        actions.append(Restart(round(at, 3), round(rng.uniform(1.0, 3.0), 3)))

    actions += _draw_machines(streams.of("machines"), profile, cases)

    actions += _draw_cancels(streams.of("cancels"), profile, cases, actions)
    actions += _draw_running_cancels(streams.of("running-cancels"), profile, actions)

    rng = streams.of("decisions")
    for _ in range(profile.decisions):
        at = rng.uniform(0.3 * length, length)
        actions.append(Decide(round(at, 3), "retry" if rng.random() < 0.7 else "fail"))

    restarts = [a for a in actions if isinstance(a, Restart)]
    actions += _draw_locks(streams, profile, cases, restarts)

    actions += _draw_events(streams, profile, cases)
    actions += _draw_pauses(streams, profile, cases)
    actions += _draw_keyed(streams, profile, cases)
    actions += _draw_races(streams, profile, cases)
    actions += _draw_approvals(streams, profile, cases)
    actions += _draw_schedules(streams, profile, cases)
    actions += _draw_rollouts(streams, profile, cases)
    actions.sort(key=lambda a: a.at)
    return Schedule(seed, profile, cases, actions)


class _Streams:
    """One random stream per kind of thing, each derived from the seed alone."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._streams: dict[str, random.Random] = {}

    def of(self, name: str) -> random.Random:
        if name not in self._streams:
            self._streams[name] = random.Random(f"{self._seed}:{name}")
        return self._streams[name]


def _draw_case(rng: random.Random, name: str, flow: str, profile: Profile) -> Case:
    if rng.random() < profile.clean_share:
        return Case(name, flow)
    calls: dict[str, list[Fault | None]] = {}
    lookups: dict[str, list[Fault | None]] = {}
    for step in all_steps(flow):
        weights = READ_WEIGHTS if step.capability == READ else WRITE_WEIGHTS
        calls[step.id] = [
            _draw_call_fault(rng, weights) if rng.random() < 0.35 else None
            for _ in range(MAX_ATTEMPTS + 1)
        ]
        if step.capability != READ:
            lookups[step.id] = [_draw_lookup_fault(rng) for _ in range(MAX_ATTEMPTS + 1)]
    return Case(name, flow, calls, lookups)


def _draw_call_fault(rng: random.Random, weights: dict[str, float]) -> Fault:
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    if kind == "transient_later":
        return Fault(kind, retry_after=round(rng.uniform(0.5, 3.0), 3))
    if kind == "late_write":
        perform = rng.uniform(1.3, 2.5)
        return Fault(kind, perform_at=round(perform, 3), answer_at=round(perform + 0.8, 3))
    if kind in ("slow_nothing", "slow_read"):
        return Fault(kind, answer_at=round(rng.uniform(1.3, 3.0), 3))
    if kind == "not_ready":
        return Fault(kind, check_again_in=round(rng.uniform(0.5, 2.0), 3))
    return Fault(kind)


def _draw_lookup_fault(rng: random.Random) -> Fault | None:
    roll = rng.random()
    if roll < 0.2:
        return Fault("unknown")
    if roll < 0.3:
        return Fault("slow_lookup", answer_at=round(rng.uniform(1.3, 2.5), 3))
    return None


def _draw_machines(rng: random.Random, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Reboots, each with its own deadline, and their agents: about half come too late."""
    length = profile.fault_seconds
    drawn: list[Action] = []
    for number in range(profile.machines):
        name = f"m{number:03d}"
        deadline = rng.randint(2, 5)
        cases[name] = Case(name, MACHINE_FLOW, data={"deadline": deadline})
        at = rng.uniform(0, 0.6 * length)
        drawn.append(Submit(round(at, 3), name))
        comes = at + rng.uniform(0.3, 2.0 * deadline + 2.0)
        drawn.append(
            AgentComes(
                round(comes, 3), name, round(rng.uniform(2.0, 4.0), 3), round(rng.uniform(0, 2), 3)
            )
        )
    return drawn


def _draw_cancels(
    rng: random.Random, profile: Profile, cases: dict[str, Case], actions: list[Action]
) -> list[Action]:
    """Cancels: most aim at a provision case made to wait after its first write, some at
    a reboot's wait (whose command an agent may or may not have taken)."""
    submitted = {a.case: a.at for a in actions if isinstance(a, Submit)}
    provisions = [name for name, case in cases.items() if case.flow == "provision"]
    machines = [name for name, case in cases.items() if case.flow == MACHINE_FLOW]
    drawn: list[Action] = []
    for number in range(profile.cancels if cases else 0):
        if machines and number % 4 == 1:
            name = rng.choice(machines)
            drawn.append(Cancel(round(submitted[name] + rng.uniform(0.2, 3.0), 3), name, True))
        elif provisions and number % 3 != 2:
            name = rng.choice(provisions)
            case = cases[name]
            # The reservation goes through, then the read keeps the execution WAITING:
            # a cancel now meets an execution with a write done.
            wait = [Fault("not_ready", check_again_in=2.0)] * 2
            calls = {**case.calls, "reserve": [None] * (MAX_ATTEMPTS + 1), "ready": list(wait)}
            cases[name] = Case(name, case.flow, calls, case.lookups, case.data, case.pauses)
            drawn.append(Cancel(round(submitted[name] + rng.uniform(0.2, 1.0), 3), name, True))
        else:
            name = rng.choice(sorted(submitted))
            drawn.append(Cancel(submitted[name], name))
    return drawn


def _draw_running_cancels(
    rng: random.Random, profile: Profile, actions: list[Action]
) -> list[Action]:
    """Cancels of executions while they run: each is requested (200, cancel requested)
    and honoured once the step's call returns, under the write rule."""
    submitted = sorted((a.at, a.case) for a in actions if isinstance(a, Submit))
    drawn: list[Action] = []
    for _ in range(profile.running_cancels if submitted else 0):
        at, name = rng.choice(submitted)
        drawn.append(Cancel(round(at + rng.uniform(0.1, 1.5), 3), name, running=True))
    return drawn


def _draw_locks(
    streams: _Streams, profile: Profile, cases: dict[str, Case], restarts: list[Restart]
) -> list[Action]:
    """Each lock comes with a case of its own and companions started beside it.

    The locked case's first call is slow (within its deadline), so the stranger takes
    the row while the execution runs: its next write (the finish, for a request row)
    then meets the lock. The companions, started around the same moment, are what must
    not wait behind it. A lock is kept clear of the restarts, which would end it.
    """
    length = profile.fault_seconds
    rng = streams.of("locks")
    drawn: list[Action] = []

    def clear(at: float) -> bool:
        return all(not (r.at - 7.0 < at < r.at + r.outage + 2.0) for r in restarts)

    for number in range(profile.locks):
        moments = [rng.uniform(0.2 * length, 0.75 * length) for _ in range(20)]
        at = next((m for m in moments if clear(m)), moments[0])
        name = f"k{number:02d}"
        slow = [Fault("slow_ok", answer_at=round(rng.uniform(0.6, 0.9), 3))]
        cases[name] = Case(name, "checkout", {"quote": slow})
        drawn.append(Submit(round(at, 3), name))
        table = rng.choice(("request", "execution"))
        drawn.append(Lock(round(at, 3), name, table, round(rng.uniform(3, 5), 3)))
        for companion in range(3):
            other = f"{name}{'abc'[companion]}"
            cases[other] = Case(other, rng.choice(MANUAL_FLOWS))
            drawn.append(Submit(round(at + rng.uniform(0.2, 1.0), 3), other))
    return drawn


def _draw_events(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Good events start the event flow (with faults like any case); poison ones cannot."""
    length = profile.fault_seconds
    rng = streams.of("events")
    drawn: list[Action] = []
    for number in range(profile.poison):
        at = rng.uniform(0.1 * length, 0.5 * length)
        drawn.append(
            Event(round(at, 3), f"p{number:03d}", POISON_KINDS[number % len(POISON_KINDS)])
        )
    # The first good event comes right after the first poison (a deep one, which the
    # database stores): it must not be stuck behind it.
    first_poison = drawn[0].at if drawn else 0.0
    for number in range(profile.events):
        at = first_poison + 1.0 if number == 0 else rng.uniform(0.05 * length, 0.8 * length)
        name = f"e{number:03d}"
        cases[name] = _draw_case(streams.of(f"case:{name}"), name, EVENT_FLOW, profile)
        drawn.append(Event(round(at, 3), name, "good"))
    return drawn


def _draw_pauses(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Workers frozen past their lease: at random (`Pause`), and at the worst moment, the
    instant before a charge's request leaves (`frozen` cases: a checkout whose first
    charge call freezes its worker; the request leaves when it wakes)."""
    length = profile.fault_seconds
    rng = streams.of("pauses")
    drawn: list[Action] = []
    for _ in range(profile.pauses):
        at = rng.uniform(0.15 * length, 0.8 * length)
        seconds = round(rng.uniform(PAUSE_MIN_SECONDS, PAUSE_MAX_SECONDS), 3)
        drawn.append(
            Pause(round(at, 3), rng.randrange(profile.workers), rng.random() < 0.7, seconds)
        )
    rng = streams.of("frozen")
    for number in range(profile.frozen):
        name = f"f{number:02d}"
        seconds = round(rng.uniform(PAUSE_MIN_SECONDS, PAUSE_MAX_SECONDS), 3)
        cases[name] = Case(name, "checkout", pauses={"charge": seconds})
        drawn.append(Submit(round(rng.uniform(0.05 * length, 0.6 * length), 3), name))
    return drawn


def _draw_keyed(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Cases that share slots (a concurrency key), with faults like any case; and cases
    that park to be corrected (every other one moving its key onto a busy slot)."""
    length = profile.fault_seconds
    rng = streams.of("keyed")
    drawn: list[Action] = []
    for number in range(profile.keyed):
        name = f"q{number:03d}"
        case = _draw_case(streams.of(f"case:{name}"), name, KEYED_FLOW, profile)
        slot = SLOTS[rng.randrange(len(SLOTS))]
        cases[name] = Case(name, KEYED_FLOW, case.calls, case.lookups, {"slot": slot})
        drawn.append(Submit(round(rng.uniform(0, 0.6 * length), 3), name))
    for number in range(profile.corrections):
        # The case parks with no write (its charge cut before, no look-up can tell).
        name, here, there = f"c{number:02d}", f"x-{number:02d}", f"y-{number:02d}"
        # Its retried charge is slow (within its deadline): long enough to meet another.
        slow = Fault("slow_ok", answer_at=0.9)
        calls: dict[str, list[Fault | None]] = {"charge": [Fault("cut_before"), slow]}
        lookups: dict[str, list[Fault | None]] = {"charge": [Fault("unknown")]}
        cases[name] = Case(name, KEYED_FLOW, calls, lookups, {"slot": here})
        at = rng.uniform(0.05 * length, 0.6 * length)
        drawn.append(Submit(round(at, 3), name))
        moment = round(at + rng.uniform(2.0, 4.0), 3)
        if number % 2 == 0:
            drawn.append(Correct(moment, name, None))
            continue
        # Two slow executions keep the slot the correction moves to busy meanwhile.
        companions = (f"{name}a", f"{name}b")
        for other in companions:
            cases[other] = Case(other, KEYED_FLOW, {"charge": [slow]}, {}, {"slot": there})
        drawn.append(Correct(moment, name, there, companions))
    return drawn


def _draw_races(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Races of operators over a park of a case of their own: its first charge call is
    cut before anything is performed and no look-up can tell (a park with no write, so
    a retry is right); its second is cut after the write (the re-run parks again, now
    with a write done that nobody has looked at)."""
    length = profile.fault_seconds
    rng = streams.of("races")
    drawn: list[Action] = []
    kinds = ["deciders"] * profile.deciders + ["bulk"] * profile.bulks
    for number, kind in enumerate(kinds):
        name = f"r{number:02d}"
        calls: dict[str, list[Fault | None]] = {
            "charge": [Fault("cut_before"), Fault("cut_after")],
        }
        lookups: dict[str, list[Fault | None]] = {
            "charge": [Fault("unknown")] * (2 * MAX_ATTEMPTS + 2),
        }
        cases[name] = Case(name, "checkout", calls, lookups)
        at = rng.uniform(0.05 * length, 0.5 * length)
        drawn.append(Submit(round(at, 3), name))
        drawn.append(Race(round(at + rng.uniform(2.0, 4.0), 3), name, kind))
    return drawn


def _draw_approvals(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Approval cases: a decision near the deadline, and most of them a cancel near the
    decision, so decision, cancel and deadline race on one execution."""
    length = profile.fault_seconds
    rng = streams.of("approvals")
    drawn: list[Action] = []
    for number in range(profile.approvals):
        name = f"a{number:02d}"
        seconds = rng.randint(2, 4)
        cases[name] = Case(name, APPROVAL_FLOW, data={"approvalSeconds": seconds})
        at = rng.uniform(0.05 * length, 0.6 * length)
        drawn.append(Submit(round(at, 3), name))
        decision = rng.choice(("approved", "rejected"))
        offset = round(rng.uniform(-1.0, 0.4), 3)
        # The cancel at the same instant (a race), just before, just after, or none.
        cancel = rng.choice(
            (0.0, 0.0, -round(rng.uniform(0.05, 0.5), 3), round(rng.uniform(0.0, 0.3), 3), None)
        )
        drawn.append(Approve(round(at, 3), name, decision, offset, cancel))
    return drawn


def _draw_schedules(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Schedules firing a clean checkout every few seconds through kills and restarts."""
    rng = streams.of("schedules")
    drawn: list[Action] = []
    for number in range(profile.schedules):
        name = f"t{number:02d}"
        cases[name] = Case(name, "checkout")
        every = rng.randint(profile.schedule_seconds, profile.schedule_seconds + 2)
        drawn.append(PutSchedule(round(rng.uniform(0, 2.0), 3), name, every))
    return drawn


def _draw_rollouts(streams: _Streams, profile: Profile, cases: dict[str, Case]) -> list[Action]:
    """Rollouts over a few items, each item's child a case with faults of its own."""
    length = profile.fault_seconds
    rng = streams.of("rollouts")
    drawn: list[Action] = []
    for number in range(profile.rollouts):
        name = f"o{number:02d}"
        items = [f"{name}-{index}" for index in range(rng.randint(3, 5))]
        for item in items:
            cases[item] = _draw_case(streams.of(f"case:{item}"), item, ROLLOUT_CHILD_FLOW, profile)
        cases[name] = Case(name, ROLLOUT_FLOW, data={"items": items})
        drawn.append(Submit(round(rng.uniform(0, 0.5 * length), 3), name))
    return drawn
