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
from pathlib import Path

from tests.acceptance.provider_double import ProviderDouble
from tests.promise.api import Api
from tests.promise.database import CheckerDatabase
from tests.promise.platform_events import insert_event
from tests.promise.schedule import (
    Action,
    AgentComes,
    Cancel,
    Decide,
    Event,
    Kill,
    Lock,
    Restart,
    Schedule,
    Submit,
)
from tests.promise.strangers import hold_row_lock
from tests.promise.workers import Workers

CANCELLABLE = ("PENDING", "RETRY_WAIT", "WAITING")
WAITS = ("RETRY_WAIT", "WAITING")
WRITE_EVENTS = ("performed", "deduplicated")


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
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="promise-action") as pool:
            for action in self.schedule.actions:
                # The moments are the schedule: waiting for one is the fault's timing.
                time.sleep(max(0.0, started + action.at - time.monotonic()))
                pool.submit(self._run, action)
            time.sleep(max(0.0, self._fault_end - time.monotonic()))
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
        more = {"deadline": case.deadline} if case.deadline is not None else None
        request_id, execution_id = self.api.start(flow, action.case, more)
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
        for execution_id, name in parked:
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
