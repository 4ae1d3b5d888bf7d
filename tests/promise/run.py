"""One checker run: its own database, the provider double, the workers, the schedule, the checks.

Phases: set up (server, migrations, flows, plan, workers); faults (the schedule's
timed actions and the provider's per-call faults); quiet (no faults, no kills: the
workers run until nothing is PENDING, RUNNING, RETRY_WAIT or WAITING and every event
is processed, or the profile's bound passes); settle (until the provider has nothing
in flight, so no late write is still to land); then the invariants.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.acceptance.provider_double import Call, Instruction, ProviderDouble
from tests.promise.adapters import PAUSES_FILE
from tests.promise.api import Api
from tests.promise.database import CheckerDatabase
from tests.promise.invariants import ACTIVE, check
from tests.promise.profiles import Profile
from tests.promise.records import Findings
from tests.promise.schedule import Schedule, draw
from tests.promise.timeline import Timeline
from tests.promise.workers import ROOT, WORKER_SETTINGS, Workers

SETTLE_SECONDS = 15.0  # the most the provider may take to finish what is in flight
STALL_SECONDS = 15.0


@dataclass
class Outcome:
    seed: int
    profile: Profile
    folder: Path
    findings: Findings = field(default_factory=Findings)
    # What the run could not do as scheduled, or saw go wrong outside the invariants (an
    # API answer of 500, a worker that died by itself): a person must look, so it fails.
    anomalies: list[str] = field(default_factory=list)
    stats: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def replay(self) -> str:
        return self.profile.replay(self.seed)

    @property
    def failed(self) -> bool:
        return bool(self.findings.violations or self.anomalies)


def instructions_for(schedule: Schedule) -> Callable[[Call], Instruction]:
    """What the provider double does with each call: the case's planned fault, else plainly."""

    def instruction(call: Call) -> Instruction:
        step = call.key.rsplit(":", 1)[-1]
        fault = schedule.fault(call.case, step, call.lookup, call.ordinal)
        return fault.instruction() if fault is not None else Instruction()

    return instruction


def run(seed: int, profile: Profile, folder: Path, say: Callable[[str], None] = print) -> Outcome:
    """Run the checker once; `say` prints progress (the seed first and last)."""
    began = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    schedule = draw(seed, profile)
    (folder / "schedule.json").write_text(schedule.to_json())
    pauses = {name: case.pauses for name, case in schedule.cases.items() if case.pauses}
    (folder / PAUSES_FILE).write_text(json.dumps(pauses))
    say(f"promise checker: seed {seed}, profile {profile.name}, {profile.workers} workers")
    say(f"  replay: {profile.replay(seed)}")
    say(f"  code: {_code_version()}")
    for line in schedule.summary():
        say(f"  {line}")
    say(f"  run folder (schedule, action log, worker logs): {folder}")
    outcome = Outcome(seed, profile, folder)

    database = CheckerDatabase()
    database.start()
    # Strict: a write is performed when its moment comes, whether its caller is there or not.
    provider = ProviderDouble(
        seed, pause=0, cut_rate=0, instructions=instructions_for(schedule), strict=True
    )
    try:
        with provider.serve():
            api = Api(database.runtime_url, int(WORKER_SETTINGS["EXECUTION_MAX_ATTEMPTS"]))
            workers = Workers(database.runtime_url, provider.url, folder, profile.workers)
            timeline = Timeline(schedule, api, database, workers, provider)
            try:
                api.set_up()
                workers.start()
                say(f"  faults for {profile.fault_seconds:g} s")
                timeline.play()
                provider.stop_obeying()
                say(f"  quiet phase: {_wait_for_quiet(database, profile.quiet_seconds)}")
                if not provider.wait_until_idle(SETTLE_SECONDS):
                    say(f"  the provider still had calls in flight after {SETTLE_SECONDS:g} s")
                timeline.log.pauses += _frozen_before_sending(folder)
                outcome.findings = check(
                    database, api, provider, timeline.event_inserts, timeline.log
                )
                outcome.stats = _stats(database, provider, timeline, workers)
                for slot, status in workers.exited():
                    timeline.log.anomaly(f"worker slot {slot} exited by itself ({status})")
                outcome.anomalies = list(timeline.log.anomalies)
                outcome.anomalies += [f"the API answered {e}" for e in api.server_errors]
            finally:
                timeline.log.save(folder / "actions.log")
                (folder / "ledger.log").write_text("\n".join(map(str, provider.ledger())) + "\n")
                workers.stop()
                api.close()
    finally:
        database.stop()
    outcome.seconds = time.monotonic() - began
    return outcome


def _wait_for_quiet(database: CheckerDatabase, seconds: float) -> str:
    """Poll until nothing is under way and every event is processed; how the wait ended.

    It gives up at the profile's bound, or sooner once nothing has moved for
    STALL_SECONDS (no execution changed, no attempt ended): what is left then is stuck.
    A PENDING execution whose concurrency key is full of parked holders waits for a
    person, rightly: it does not count as under way.
    """
    deadline = time.monotonic() + seconds
    statuses = ", ".join(f"'{s}'" for s in ACTIVE)
    last: tuple[object, ...] = ()
    moved = time.monotonic()
    while True:
        ((active, events, changed, attempts),) = database.rows(
            f"""SELECT (SELECT count(*) FROM execution e WHERE status IN ({statuses})
                         AND NOT (status = 'PENDING' AND concurrency_key IS NOT NULL
                                  AND (SELECT count(*) FROM execution h
                                       WHERE h.org_id = e.org_id
                                         AND h.concurrency_key = e.concurrency_key
                                         AND h.status = 'RECONCILIATION_REQUIRED')
                                      >= e.concurrency_limit)),
                       (SELECT count(*) FROM platform_event WHERE processed_at IS NULL),
                       (SELECT max(updated_at) FROM execution),
                       (SELECT count(*) FROM action_attempt)"""
        )
        if active == 0 and events == 0:
            return "everything ended or parked"
        now = time.monotonic()
        if (active, events, changed, attempts) != last:
            last, moved = (active, events, changed, attempts), now
        elif now - moved > STALL_SECONDS:
            return f"nothing moved for {STALL_SECONDS:g} s ({active} under way, {events} events)"
        if now > deadline:
            return f"bound passed ({active} under way, {events} events unprocessed)"
        time.sleep(0.25)


def _stats(
    database: CheckerDatabase, provider: ProviderDouble, timeline: Timeline, workers: Workers
) -> list[str]:
    statuses = database.rows("SELECT status, count(*) FROM execution GROUP BY 1 ORDER BY 1")
    reasons = database.rows(
        "SELECT error_code, count(*) FROM execution WHERE status = 'RECONCILIATION_REQUIRED' "
        "GROUP BY 1 ORDER BY 1"
    )
    ledger = provider.ledger()
    calls = Counter(
        f"{line.route}{' lookup' if line.lookup else ''} {line.event}" for line in ledger
    )
    answers = Counter(
        _lookup_answer(line.detail) for line in ledger if line.lookup and line.event == "answered"
    )
    events = database.rows(
        "SELECT coalesce(outcome, 'unprocessed'), count(*) FROM platform_event GROUP BY 1"
    )
    # Finishes that continued, and how the continuations ended (invariant 9 checks each).
    continued = database.rows(
        "SELECT status, count(*) FROM execution WHERE continued_from IS NOT NULL"
        " GROUP BY 1 ORDER BY 1"
    )
    lines = [
        "executions: " + ", ".join(f"{n} {s}" for s, n in statuses),
        "parked for: " + (", ".join(f"{n} {r}" for r, n in reasons) or "nothing"),
        "provider: " + ", ".join(f"{n} {e}" for e, n in sorted(calls.items())),
        "look-ups answered: " + ", ".join(f"{n} {a}" for a, n in sorted(answers.items())),
        "platform events: " + ", ".join(f"{n} {o}" for o, n in events),
        "machine commands: "
        + (
            ", ".join(
                f"{n} {s}"
                for s, n in database.rows(
                    "SELECT status, count(*) FROM machine_command GROUP BY 1 ORDER BY 1"
                )
            )
            or "none"
        )
        + f"; {len(timeline.log.handed)} handed to the checker's agents",
        "continuations: " + (", ".join(f"{n} {s}" for s, n in continued) or "none"),
        f"workers killed: {len(workers.killed)}, frozen: {len(workers.paused)} by the checker"
        f" and {len(list(workers.folder.glob('paused-*')))} before a send",
        "races: "
        + (
            "; ".join(f"{r.kind} {r.case}: {', '.join(r.answers)}" for r in timeline.log.races)
            or "none"
        ),
        "approvals: "
        + (
            ", ".join(
                f"{n} {s}"
                for s, n in database.rows(
                    "SELECT status, count(*) FROM approval GROUP BY 1 ORDER BY 1"
                )
            )
            or "none"
        ),
        "rollouts: "
        + (
            ", ".join(
                f"{r.total} items: {r.succeeded} succeeded, {r.failed} failed, "
                f"{r.cancelled} cancelled, {r.total - r.next_index} never started"
                for r in database.rows(
                    "SELECT total, next_index, succeeded, failed, cancelled FROM rollout"
                )
            )
            or "none"
        ),
        "schedule fires: "
        + (
            ", ".join(
                f"{n} of {s}"
                for s, n in database.rows(
                    "SELECT schedule_id, count(*) FROM schedule_fire GROUP BY 1 ORDER BY 1"
                )
            )
            or "none"
        ),
    ]
    return lines


def _frozen_before_sending(folder: Path) -> list[tuple[float, float]]:
    """The freezes the adapters made (their marker files): (began, ended) wall-clock."""
    windows = []
    for marker in folder.glob("paused-*"):
        began, _, seconds, _ = marker.read_text().split()
        windows.append((float(began), float(began) + float(seconds)))
    return windows


def _lookup_answer(detail: str) -> str:
    for answer in ("not found", "found", "unknown"):
        if detail.startswith(answer):
            return answer
    return detail


def _code_version() -> str:
    """The commit the run checks, and whether the tree had changes on top of it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "orquestador", "migrations"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{commit or 'unknown'}{' with uncommitted changes' if dirty else ''}"
