"""Plays the schedule's timed actions at their moments against the running system.

Each action runs on a thread of its own, so a slow one (a lock held for seconds, a
cancel waiting for its moment, a call waiting out the restart) never delays the next.
What each action did is written to the action log, with its time.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.acceptance.provider_double import ProviderDouble
from tests.promise.api import Api
from tests.promise.database import CheckerDatabase
from tests.promise.platform_events import insert_event
from tests.promise.schedule import (
    Action,
    AgentComes,
    Approve,
    Cancel,
    Correct,
    Decide,
    Event,
    Kill,
    Lock,
    Pause,
    PutSchedule,
    Race,
    Restart,
    Schedule,
    Submit,
)
from tests.promise.strangers import hold_bulk_item, hold_row_lock
from tests.promise.workers import Workers

CANCELLABLE = ("PENDING", "RETRY_WAIT", "WAITING")
WAITS = ("RETRY_WAIT", "WAITING")
WRITE_EVENTS = ("performed", "deduplicated")
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
AWAY = 60.0  # the most a racing operator's call may take (the API retries a 503 for 30 s)
PARK_PATIENCE = 30.0  # how long an operator waits for the park (or approval) it came for


@dataclass(frozen=True)
class HeldLock:
    """A row a stranger held, from began to ended (time.time()), and whose execution it was."""

    began: float
    ended: float
    table: str
    execution_id: uuid.UUID


@dataclass(frozen=True)
class Handed:
    """A command the checker's agent was handed: when (time.time()) and its deliver-by time."""

    case: str
    command_id: str
    deliver_by: str
    received_at: float


@dataclass(frozen=True)
class RaceRun:
    """Two operators on one park: what each was answered (and the bulk's id)."""

    case: str
    kind: str
    execution_id: uuid.UUID
    answers: tuple[str, ...]
    bulk_id: uuid.UUID | None = None


@dataclass
class ActionLog:
    """What the timeline did, line by line, with seconds since the fault phase began.

    It also keeps the wall-clock windows of the disturbances the checks need to know:
    rows held by strangers, the database's outages, and kills.
    """

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    held_locks: list[HeldLock] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)
    handed: list[Handed] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)
    races: list[RaceRun] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    # Cancels refused 409 while the execution was still live: (case, execution, answer).
    refused_cancels: list[tuple[str, uuid.UUID, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, text: str) -> None:
        with self._lock:
            self.lines.append(f"{time.monotonic() - self.started:8.3f}  {text}")

    def anomaly(self, text: str) -> None:
        self.note(f"ANOMALY {text}")
        with self._lock:
            self.anomalies.append(text)

    def save(self, path: Path) -> None:
        with self._lock:
            path.write_text("\n".join(self.lines) + "\n")


def _said(code: int, body: object) -> str:
    """An answer in a few words: its code and the status it gives, or its problem's code."""
    if not isinstance(body, dict):
        return f"{code} {body}"
    return f"{code} {body.get('code') if code >= 400 else body.get('status')}"


class Timeline:
    def __init__(
        self,
        schedule: Schedule,
        api: Api,
        database: CheckerDatabase,
        workers: Workers,
        provider: ProviderDouble,
    ) -> None:
        self.schedule = schedule
        self.api = api
        self.db = database
        self.workers = workers
        self.provider = provider
        self.log = ActionLog()
        self.executions: dict[str, uuid.UUID] = {}
        self.requests: dict[str, uuid.UUID] = {}
        self.event_inserts: dict[str, str] = {}
        self._known = threading.Condition()
        self._kill_lock = threading.Lock()
        self._operator = threading.Lock()  # one operator: decisions one at a time
        self._fault_end = 0.0

    def play(self) -> None:
        """Run every action at its moment; return once the fault phase is over."""
        started = self.log.started = time.monotonic()
        self._fault_end = started + self.schedule.profile.fault_seconds
        with ThreadPoolExecutor(max_workers=64, thread_name_prefix="promise-action") as pool:
            for action in self.schedule.actions:
                # The moments are the schedule: waiting for one is the fault's timing.
                time.sleep(max(0.0, started + action.at - time.monotonic()))
                pool.submit(self._run, action)
            time.sleep(max(0.0, self._fault_end - time.monotonic()))
        for name in self.log.schedules:
            case = self.schedule.cases[name]
            every = next(
                a.every
                for a in self.schedule.actions
                if isinstance(a, PutSchedule) and a.case == name
            )
            code, _ = self.api.put_schedule(name, case.flow, every, name, paused=True)
            self.log.note(f"schedule {name} paused: {code}")
        self.log.note("fault phase over")

    def _run(self, action: Action) -> None:
        try:
            handler = getattr(self, f"_{type(action).__name__.lower()}")
            handler(action)
        except Exception as error:
            self.log.anomaly(f"{action}: {type(error).__name__}: {error}")
            self.log.note(traceback.format_exc().replace("\n", " | "))

    def _execution_of(self, case: str, timeout: float = 10.0) -> uuid.UUID | None:
        """The case's execution id, once its submission has been accepted."""
        deadline = time.monotonic() + timeout
        with self._known:
            while case not in self.executions:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._known.wait(left)
            return self.executions[case]

    # --- the actions ------------------------------------------------------------------

    def _submit(self, action: Submit) -> None:
        case = self.schedule.cases[action.case]
        flow = case.flow
        request_id, execution_id = self.api.start(flow, action.case, case.data or None)
        with self._known:
            self.requests[action.case] = request_id
            self.executions[action.case] = execution_id
            self._known.notify_all()
        self.log.note(f"submit {action.case} ({flow}): execution {execution_id}")

    def _kill(self, action: Kill) -> None:
        with self._kill_lock:
            pids = self.workers.pids()
            slot, why = action.slot % len(self.workers.slots), "scheduled slot"
            if action.mid_call:
                calls = sorted(
                    (c for c in self.provider.in_flight() if c.pid in pids), key=lambda c: c.key
                )
                if calls:
                    slot, why = pids[calls[0].pid], f"mid-call ({calls[0].phase} {calls[0].key})"
            self.log.kills.append(time.time())
            pid = self.workers.kill(slot)
        self.log.note(f"kill -9 worker slot {slot} pid {pid}: {why}")

    def _pause(self, action: Pause) -> None:
        with self._kill_lock:
            pids = self.workers.pids()
            slot, why = action.slot % len(self.workers.slots), "scheduled slot"
            if action.mid_call:
                calls = sorted(
                    (c for c in self.provider.in_flight() if c.pid in pids), key=lambda c: c.key
                )
                if calls:
                    slot, why = pids[calls[0].pid], f"mid-call ({calls[0].phase} {calls[0].key})"
        self.log.note(f"SIGSTOP worker slot {slot} for {action.seconds:.1f} s: {why}")
        began = time.time()
        pid = self.workers.pause(slot, action.seconds)
        with self.log._lock:
            self.log.pauses.append((began, time.time()))
        self.log.note(f"SIGCONT worker slot {slot} pid {pid}")

    def _restart(self, action: Restart) -> None:
        self.log.note(f"PostgreSQL stop (immediate), {action.outage:.1f} s away")
        began = time.time()
        try:
            self.db.restart(action.outage)
        finally:
            self.log.outages.append((began, time.time()))
        self.log.note("PostgreSQL started again")

    def _status(self, execution_id: uuid.UUID) -> str:
        rows = self.db.rows("SELECT status FROM execution WHERE id = :id", id=execution_id)
        return str(rows[0].status)

    def _status_when(self, execution_id: uuid.UUID, wanted: tuple[str, ...], seconds: float) -> str:
        """Poll the execution until its status is one of `wanted`; the last status seen."""
        deadline = time.monotonic() + seconds
        while True:
            status = self._status(execution_id)
            if status in wanted or time.monotonic() > deadline:
                return status
            time.sleep(0.02)

    def _cancel(self, action: Cancel) -> None:
        execution_id = self._execution_of(action.case)
        if execution_id is None:
            self.log.note(f"cancel {action.case}: never accepted")
            return
        if action.running:
            self._cancel_running(action, execution_id)
            return
        answers: list[str] = []
        wanted = WAITS if action.after_write else CANCELLABLE
        while time.monotonic() < self._fault_end:
            status = self._status(execution_id)
            if status in wanted:
                code, body = self.api.cancel(execution_id, "the promise checker cancels")
                answers.append(
                    f"{status}->{code} {(body or {}).get('status') or (body or {}).get('code')}"
                )
                if code == 200:
                    break
            elif status not in CANCELLABLE and status != "RUNNING":
                answers.append(f"{status}: too late")
                break
            time.sleep(0.1)
        self.log.note(
            f"cancel {action.case} ({execution_id}): {', '.join(answers) or 'never cancellable'}"
        )

    def _cancel_running(self, action: Cancel, execution_id: uuid.UUID) -> None:
        status = self._status_when(execution_id, ("RUNNING", *ENDED), PARK_PATIENCE)
        if status != "RUNNING":
            self.log.note(f"cancel {action.case} while it runs: it never ran ({status})")
            return
        answer = self.api.cancel(execution_id, "the promise checker cancels a running one")
        after = self._status(execution_id)
        requested = isinstance(answer[1], dict) and answer[1].get("cancelRequested")
        if answer[0] == 409 and after in (*CANCELLABLE, "RUNNING"):
            with self.log._lock:
                self.log.refused_cancels.append(
                    (action.case, execution_id, f"{_said(*answer)}, {after} after")
                )
        self.log.note(
            f"cancel {action.case} ({execution_id}) while it runs: {_said(*answer)}"
            f"{' (cancel requested)' if requested else ''}, {after} after"
        )

    def _decide(self, action: Decide) -> None:
        with self._operator:
            self._decide_one(action)

    def _decide_one(self, action: Decide) -> None:
        parked = self.db.rows(
            """SELECT e.id, coalesce(r.data->>'case', r.machine_id) AS name
               FROM execution e JOIN request r ON r.id = e.request_id
               WHERE e.status = 'RECONCILIATION_REQUIRED' ORDER BY 2, e.created_at"""
        )
        in_flight = {c.key for c in self.provider.in_flight()}
        # The parks a race or a correction is planned on are theirs to decide.
        reserved = {a.case for a in self.schedule.actions if isinstance(a, Race | Correct)}
        for execution_id, name in parked:
            if name in reserved:
                continue
            evidence = self.api.evidence(execution_id)
            if evidence["execution"]["status"] != "RECONCILIATION_REQUIRED":
                continue  # a worker took it back meanwhile (nothing else decides)
            step = evidence.get("inDoubt")
            key = f"{execution_id}:{step}" if step else None
            if key in in_flight:
                continue  # the provider is still working on it: an operator would wait
            writes = (
                [line for line in self.provider.ledger(key) if line.event in WRITE_EVENTS]
                if key
                else []
            )
            if writes:
                decision, output = "confirm", json.loads(writes[-1].detail)
                reason = f"the provider shows {writes[-1].detail} under {key}"
            else:
                decision, output = action.prefer, None
                reason = f"the provider shows no write under {key}" if key else "nothing in doubt"
            code, body = self.api.decide(execution_id, step, decision, reason, output)
            answer = (body or {}).get("status") or (body or {}).get("code")
            self.log.note(
                f"decide {name} ({execution_id}, {evidence.get('reason')}, in doubt {step}):"
                f" {decision} -> {code} {answer}"
            )
            return
        self.log.note(f"decide: nothing to decide ({len(parked)} parked)")

    def _parked_step(self, execution_id: uuid.UUID) -> tuple[str | None, bool] | None:
        """The parked execution's step in doubt and whether the provider shows its write;
        None when it is no longer parked or the provider still works on it."""
        evidence = self.api.evidence(execution_id)
        if evidence["execution"]["status"] != "RECONCILIATION_REQUIRED":
            return None
        step = evidence.get("inDoubt")
        key = f"{execution_id}:{step}" if step else None
        if key in {c.key for c in self.provider.in_flight()}:
            return None
        written = bool(key) and any(
            line.event in WRITE_EVENTS for line in self.provider.ledger(key)
        )
        return step, written

    def _correct(self, action: Correct) -> None:
        execution_id = self._execution_of(action.case)
        if execution_id is None:
            self.log.note(f"correct {action.case}: never accepted")
            return
        status = self._status_when(execution_id, ("RECONCILIATION_REQUIRED",), PARK_PATIENCE)
        with self._operator:
            parked = (
                self._parked_step(execution_id) if status == "RECONCILIATION_REQUIRED" else None
            )
            if parked is None or parked[1]:
                self.log.note(f"correct {action.case}: nothing to correct ({status}, {parked})")
                return
            if action.to_slot is not None:
                correction = [{"path": "/slot", "value": action.to_slot}]
                self._busy(action.companions)
            else:
                correction = [{"path": "/note", "value": "corrected by the promise checker"}]
            reason = "the provider shows no write; the request is corrected"
            answer = self.api.decide(
                execution_id, parked[0], "retry", reason, correction=correction
            )
            said = _said(*answer)
            if answer[0] == 422 and (answer[1] or {}).get("code") == "CORRECTION_INVALID":
                again = self.api.decide(
                    execution_id, parked[0], "retry", "retried without the correction"
                )
                said += f", then without it: {_said(*again)}"
        self.log.note(f"correct {action.case} ({execution_id}) {correction}: {said}")

    def _busy(self, companions: tuple[str, ...]) -> None:
        """Start the companions and return once one of them runs (holds its key)."""
        for name in companions:
            self._submit(Submit(0.0, name))
        first = self._execution_of(companions[0])
        if first is not None:
            self._status_when(first, ("RUNNING", *ENDED), seconds=10.0)

    def _race(self, action: Race) -> None:
        execution_id = self._execution_of(action.case)
        if execution_id is None:
            self.log.note(f"race {action.case}: never accepted")
            return
        status = self._status_when(execution_id, ("RECONCILIATION_REQUIRED",), PARK_PATIENCE)
        parked = self._parked_step(execution_id) if status == "RECONCILIATION_REQUIRED" else None
        if parked is None or parked[1]:
            self.log.note(f"race {action.case}: no park to race on ({status}, {parked})")
            return
        step = parked[0]
        if action.kind == "deciders":
            answers = self._two_deciders(execution_id, step)
            run = RaceRun(action.case, action.kind, execution_id, tuple(answers))
        else:
            run = self._bulk_against_single(action.case, execution_id, step)
        with self.log._lock:
            self.log.races.append(run)
        self.log.note(f"race {action.kind} on {action.case} ({execution_id}): {run.answers}")

    def _two_deciders(self, execution_id: uuid.UUID, step: str | None) -> list[str]:
        start = threading.Barrier(2)
        answers: list[str] = []

        def decide(who: str) -> None:
            start.wait(5)
            answer = self.api.decide(execution_id, step, "retry", f"{who}: no write shows")
            with self.log._lock:
                answers.append(_said(*answer))

        deciders = [threading.Thread(target=decide, args=(w,)) for w in ("first", "second")]
        for thread in deciders:
            thread.start()
        for thread in deciders:
            thread.join(AWAY)
        return answers

    def _bulk_against_single(self, case: str, execution_id: uuid.UUID, step: str | None) -> RaceRun:
        ((created, flow_id),) = self.db.rows(
            "SELECT created_at, flow_id FROM execution WHERE id = :id", id=execution_id
        )
        margin = timedelta(microseconds=500)
        filter = {
            "status": "RECONCILIATION_REQUIRED",
            "flowId": str(flow_id),
            "createdAfter": (created - margin).isoformat(),
            "createdBefore": (created + margin).isoformat(),
        }
        code, body = self.api.bulk("retry", "the outage is over: retry them", filter)
        if code != 202:
            return RaceRun(case, "bulk", execution_id, (f"bulk {code} {body}",))
        bulk_id = uuid.UUID(body["bulkId"])
        had, release, held = threading.Event(), threading.Event(), threading.Event()
        holds: list[str] = []

        def hold() -> None:
            holds.append(
                hold_bulk_item(self.db.owner, bulk_id, execution_id, had, release, 20, held).what
            )

        stranger = threading.Thread(target=hold)
        stranger.start()
        had.wait(5)
        if not held.is_set():
            # The bulk's worker may act now: a single retry could meet the park it leaves
            # behind, an operator's own mistake, not the race this is about.
            release.set()
            stranger.join(AWAY)
            answers = (f"bulk 202 {bulk_id}", f"item: {', '.join(holds)}", "no single decision")
            return RaceRun(case, "bulk", execution_id, answers, bulk_id)
        single = self.api.decide(execution_id, step, "retry", "one by one: no write shows")
        # The re-run parks again (its charge is cut after the write, nobody can tell):
        # only then may the bulk's worker take the item.
        again = self._status_when(execution_id, ("RECONCILIATION_REQUIRED", *ENDED), seconds=12.0)
        release.set()
        stranger.join(AWAY)
        answers = (
            f"bulk 202 {bulk_id} total {body.get('total')}",
            f"item: {', '.join(holds)}",
            f"single {_said(*single)}",
            f"then {again}",
        )
        return RaceRun(case, "bulk", execution_id, answers, bulk_id)

    def _approve(self, action: Approve) -> None:
        execution_id = self._execution_of(action.case)
        if execution_id is None:
            self.log.note(f"approve {action.case}: never accepted")
            return
        rows: list[Any] = []
        give_up = time.monotonic() + PARK_PATIENCE
        while not rows and time.monotonic() < give_up:
            rows = self.db.rows(
                "SELECT id, deadline_at FROM approval WHERE execution_id = :id", id=execution_id
            )
            time.sleep(0.05)
        if not rows:
            self.log.note(f"approve {action.case}: no approval was asked")
            return
        decide_at = rows[0].deadline_at.timestamp() + action.offset
        said: list[str] = []

        def decide() -> None:
            time.sleep(max(0.0, decide_at - time.time()))
            answer = self.api.decide_approval(str(rows[0].id), action.decision)
            said.append(f"{action.decision} {_said(*answer)}")

        def cancel() -> None:
            assert action.cancel is not None
            time.sleep(max(0.0, decide_at + action.cancel - time.time()))
            answer = self.api.cancel(execution_id, "the promise checker cancels")
            after = self._status(execution_id)
            said.append(f"cancel {_said(*answer)} ({after} after)")
            if answer[0] == 409 and after in (*CANCELLABLE, "RUNNING"):
                with self.log._lock:
                    self.log.refused_cancels.append(
                        (action.case, execution_id, f"{_said(*answer)}, {after} after")
                    )

        people = [threading.Thread(target=decide)]
        if action.cancel is not None:
            people.append(threading.Thread(target=cancel))
        for person in people:
            person.start()
        for person in people:
            person.join(AWAY)
        self.log.note(
            f"approve {action.case} ({execution_id}), {action.offset:+.2f} s from its deadline"
            f" (cancel {action.cancel}): {'; '.join(said)}; now {self._status(execution_id)}"
        )

    def _putschedule(self, action: PutSchedule) -> None:
        case = self.schedule.cases[action.case]
        code, body = self.api.put_schedule(action.case, case.flow, action.every, action.case)
        if code not in (200, 201):
            self.log.anomaly(f"schedule {action.case} not put: {_said(code, body)} {body}")
            return
        with self.log._lock:
            self.log.schedules.append(action.case)
        self.log.note(f"schedule {action.case} every {action.every} s: {_said(code, body)}")

    def _lock(self, action: Lock) -> None:
        execution_id = self._execution_of(action.case)
        row_id = execution_id if action.table == "execution" else self.requests.get(action.case)
        if row_id is None or execution_id is None:
            self.log.note(f"lock {action.table} of {action.case}: never accepted")
            return
        status = self._status_when(execution_id, ("RUNNING",), seconds=5.0)
        if status != "RUNNING":
            self.log.note(f"lock {action.table} of {action.case}: it never ran ({status})")
            return
        hold = hold_row_lock(self.db.owner, action.table, row_id, action.hold)
        if hold.what == "held":
            self.log.held_locks.append(HeldLock(hold.began, hold.ended, action.table, execution_id))
        self.log.note(
            f"lock {action.table} {row_id} of {action.case} for {action.hold:.1f} s: {hold.what}"
        )

    def _event(self, action: Event) -> None:
        outcome = insert_event(self.db.platform_conninfo(), action.name, action.kind)
        self.event_inserts[action.name] = outcome
        self.log.note(f"platform event {action.name} ({action.kind}): {outcome}")

    def _agentcomes(self, action: AgentComes) -> None:
        """The machine's agent, as the reference agent behaves: poll, run, report."""
        token = self.api.agent_token(action.case)
        give_up = time.monotonic() + action.patience
        said: list[str] = []
        while time.monotonic() < give_up:
            code, body = self.api.take_command(token)
            if code == 200 and isinstance(body, dict) and body.get("cancelRequested"):
                said.append(f"stop asked for {body['id']}")
                self.api.report_command(token, body["id"], "cancelled")
                continue
            if code == 200 and isinstance(body, dict):
                received = time.time()
                with self.log._lock:
                    self.log.handed.append(
                        Handed(action.case, body["id"], str(body.get("deliverBy")), received)
                    )
                ran = self.api.report_command(token, body["id"], "running")
                # How long the command runs on the machine is the schedule's.
                time.sleep(action.runs_for)
                done = self.api.report_command(token, body["id"], "succeeded")
                said.append(f"handed {body['id']}: running {ran[0]}, succeeded {done[0]}")
                break
            if code != 204:
                said.append(f"poll answered {code} {body}")
            time.sleep(0.2)
        self.log.note(f"agent of {action.case}: {'; '.join(said) or 'handed nothing'}")
