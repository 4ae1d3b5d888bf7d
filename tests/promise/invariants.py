"""The promise's invariants, checked against the database and the provider's ledger.

1. No external key of a NON_IDEMPOTENT_WRITE step was performed twice by the provider.
2. No succeeded step ran again: no call under its key was sent after its SUCCEEDED
   checkpoint committed (the ledger's send times against the checkpoint's and attempt
   history's end times: the same machine, the same clock).
3. Every accepted request ended (SUCCEEDED, FAILED, CANCELLED) or parks
   (RECONCILIATION_REQUIRED) with a reason, its busy marker agreeing; every platform
   event the platform inserted was processed, poison or not.
4. No request was released while a write was in doubt: an execution that ended FAILED
   or CANCELLED has no write performed under its keys, a write landing after it ended
   included. A declared failure (a step's error exit) or an operator's `fail` may
   release a request whose earlier writes are known (SUCCEEDED): those, and only those,
   are allowed.
5. Every parked execution's evidence names the step in doubt. It may name none only
   when every step succeeded (the transition failed after its writes, e.g.
   REQUEST_CHANGED or CANCELLED_AFTER_WRITES with every write known); those parks are
   listed in the report, not silently allowed. At most one step is unfinished (steps
   run one after another), or no single step could be named.
6. No head-of-line blocking (SPEC section 15): a step's success is committed soon after
   its provider answered, even while a stranger holds another execution's row. A
   success committed HOL_SECONDS or more after its answer, most of that time inside a
   window where another execution's row was held, and with no database outage or kill
   around it, waited behind a row it had nothing to do with.

Invariant 3 also checks that an execution's record agrees with itself: one that ended
SUCCEEDED has every step SUCCEEDED and one TRANSITION_COMPLETED row (a half-written
batch row would show here).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.acceptance.provider_double import CHARGES, READS, LedgerLine, ProviderDouble
from tests.promise.api import Api
from tests.promise.database import CheckerDatabase
from tests.promise.timeline import ActionLog

ACTIVE = ("PENDING", "RUNNING", "RETRY_WAIT", "WAITING")
RELEASED = ("FAILED", "CANCELLED")
# How much later than a checkpoint's commit a call may be stamped and still count as
# sent before it (clock reads on both sides of one machine).
CLOCK_MARGIN_SECONDS = 0.02

NAMES = {
    1: "no external key written twice by a non-idempotent step",
    2: "no succeeded step re-run",
    3: "every accepted request ends or parks with a reason",
    4: "no request released while a write is in doubt",
    5: "every parked execution's evidence names the step in doubt",
    6: "no head-of-line blocking behind another execution's locked row",
}
HOL_SECONDS = 2.0
# Slowness this close to a database outage or a kill is recovery, not blocking.
RECOVERY_SECONDS = 5.0


@dataclass(frozen=True)
class Violation:
    invariant: int
    message: str
    execution_id: uuid.UUID | None = None
    case: str = ""
    key: str = ""
    evidence: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        head = [f"VIOLATION of invariant {self.invariant} ({NAMES[self.invariant]})"]
        where = []
        if self.execution_id is not None:
            where.append(f"execution {self.execution_id}")
        if self.case:
            where.append(f"case {self.case}")
        if self.key:
            where.append(f"key {self.key}")
        if where:
            head.append("  " + ", ".join(where))
        head.append(f"  {self.message}")
        return head + [f"    {line}" for line in self.evidence]


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _State:
    """Everything the checks read from the database, once, after the run."""

    executions: list[Any]
    checkpoints: dict[uuid.UUID, list[Any]]
    attempts: dict[tuple[uuid.UUID, str], list[Any]]
    audit: dict[uuid.UUID, list[Any]]
    busy: dict[uuid.UUID, uuid.UUID]
    events: list[Any]


def check(
    database: CheckerDatabase,
    api: Api,
    provider: ProviderDouble,
    event_inserts: dict[str, str],
    disturbances: ActionLog,
) -> Findings:
    state = _read(database)
    ledger = defaultdict(list)
    for line in provider.ledger():
        ledger[line.key].append(line)
    findings = Findings()
    checks = _Checks(state, ledger, findings)
    checks.no_double_write()
    checks.no_rerun()
    checks.ends_or_parks(event_inserts)
    checks.no_release_in_doubt()
    checks.evidence_names_step(api)
    checks.no_head_of_line_blocking(disturbances)
    return findings


def _read(database: CheckerDatabase) -> _State:
    executions = database.rows(
        """SELECT e.id, e.request_id, e.status, e.error_code, e.finished_at, e.attempts,
                  f.key AS flow, coalesce(r.data->>'case', r.machine_id) AS name
           FROM execution e JOIN request r ON r.id = e.request_id JOIN flow f ON f.id = e.flow_id
           ORDER BY 8, e.created_at"""
    )
    checkpoints: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for row in database.rows(
        """SELECT execution_id, action_id, status, effect, external_key, attempt, error_code,
                  started_at, finished_at
           FROM action_execution ORDER BY started_at"""
    ):
        checkpoints[row.execution_id].append(row)
    attempts: dict[tuple[uuid.UUID, str], list[Any]] = defaultdict(list)
    for row in database.rows(
        """SELECT execution_id, action_id, attempt, status, error_code, message, started_at,
                  finished_at
           FROM action_attempt ORDER BY execution_id, action_id, attempt"""
    ):
        attempts[(row.execution_id, row.action_id)].append(row)
    audit: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for row in database.rows(
        """SELECT execution_id, kind, actor, created_at, detail->>'decision' AS decision,
                  detail->>'reason' AS reason, detail->>'errorCode' AS error_code
           FROM audit_event WHERE execution_id IS NOT NULL ORDER BY id"""
    ):
        audit[row.execution_id].append(row)
    busy = {
        row.busy_execution_id: row.id
        for row in database.rows(
            "SELECT id, busy_execution_id FROM request WHERE busy_execution_id IS NOT NULL"
        )
    }
    # Never the data: a poison event's is too deep to decode.
    events = database.rows(
        "SELECT id, outcome, processed_at, execution_id FROM platform_event ORDER BY received_at"
    )
    return _State(executions, checkpoints, attempts, audit, busy, events)


def _at(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone().strftime("%H:%M:%S.%f")[:-3]


def _sent(line: LedgerLine) -> float:
    return line.sent_at or line.at


class _Checks:
    def __init__(
        self, state: _State, ledger: dict[str, list[LedgerLine]], findings: Findings
    ) -> None:
        self.state = state
        self.ledger = ledger
        self.findings = findings
        self.by_id = {e.id: e for e in state.executions}

    def _violation(
        self,
        invariant: int,
        message: str,
        execution: Any = None,
        key: str = "",
        evidence: list[str] | None = None,
    ) -> None:
        self.findings.violations.append(
            Violation(
                invariant,
                message,
                execution.id if execution is not None else None,
                execution.name if execution is not None else "",
                key,
                tuple(evidence or []),
            )
        )

    def _history(self, execution_id: uuid.UUID, keys: list[str] | None = None) -> list[str]:
        """The execution's checkpoints and attempts, and the ledger of its keys."""
        lines = []
        execution = self.by_id.get(execution_id)
        if execution is not None:
            lines.append(
                f"execution {execution.status} {execution.error_code or ''} (flow "
                f"{execution.flow}, {execution.attempts} claims, "
                f"ended {_at(execution.finished_at)})"
            )
        for checkpoint in self.state.checkpoints.get(execution_id, []):
            lines.append(
                f"checkpoint {checkpoint.action_id} {checkpoint.effect} {checkpoint.status} "
                f"{checkpoint.error_code or ''} attempt {checkpoint.attempt} "
                f"ended {_at(checkpoint.finished_at)}"
            )
            for attempt in self.state.attempts.get((execution_id, checkpoint.action_id), []):
                lines.append(
                    f"  attempt {attempt.attempt}: {attempt.status} {attempt.error_code or ''} "
                    f"{_at(attempt.started_at)} -> {_at(attempt.finished_at)} "
                    f"{(attempt.message or '')[:120]}"
                )
        for row in self.state.audit.get(execution_id, []):
            extra = " ".join(
                str(v) for v in (row.decision, row.reason, row.error_code) if v is not None
            )
            lines.append(f"audit {_at(row.created_at)} {row.kind} {row.actor or ''} {extra}")
        for key in keys if keys is not None else self._keys(execution_id):
            lines += [f"ledger {line}" for line in self.ledger.get(key, [])]
        return lines

    def _keys(self, execution_id: uuid.UUID) -> list[str]:
        prefix = f"{execution_id}:"
        return sorted(key for key in self.ledger if key.startswith(prefix))

    # --- 1 --------------------------------------------------------------------------

    def no_double_write(self) -> None:
        for key, lines in self.ledger.items():
            performed = [x for x in lines if x.route == CHARGES and x.event == "performed"]
            if len(performed) > 1:
                execution_id = uuid.UUID(key.split(":", 1)[0])
                self._violation(
                    1,
                    f"the provider performed {len(performed)} writes under one key",
                    self.by_id.get(execution_id),
                    key,
                    self._history(execution_id, [key]),
                )

    # --- 2 --------------------------------------------------------------------------

    def no_rerun(self) -> None:
        for execution_id, checkpoints in self.state.checkpoints.items():
            for checkpoint in checkpoints:
                ends = [
                    a.finished_at
                    for a in self.state.attempts.get((execution_id, checkpoint.action_id), [])
                    if a.status == "SUCCEEDED" and a.finished_at is not None
                ]
                if checkpoint.status == "SUCCEEDED" and checkpoint.finished_at is not None:
                    ends.append(checkpoint.finished_at)
                if not ends:
                    continue
                succeeded = min(ends).timestamp()
                key = checkpoint.external_key
                later = [
                    line
                    for line in self.ledger.get(key, [])
                    if line.event == "arrived"
                    and not line.lookup
                    and _sent(line) > succeeded + CLOCK_MARGIN_SECONDS
                ]
                if later:
                    self._violation(
                        2,
                        f"{len(later)} call(s) sent after the step's SUCCEEDED checkpoint "
                        f"committed at {_at(min(ends))}",
                        self.by_id.get(execution_id),
                        key,
                        self._history(execution_id, [key]),
                    )

    # --- 3 --------------------------------------------------------------------------

    def ends_or_parks(self, event_inserts: dict[str, str]) -> None:
        for execution in self.state.executions:
            if execution.status in ACTIVE:
                self._violation(
                    3,
                    f"still {execution.status} after the quiet phase",
                    execution,
                    evidence=self._history(execution.id),
                )
            elif execution.status == "RECONCILIATION_REQUIRED":
                if not execution.error_code:
                    self._violation(
                        3, "parked with no reason", execution, evidence=self._history(execution.id)
                    )
                if execution.id not in self.state.busy:
                    self._violation(
                        3,
                        "parked, but its request was released",
                        execution,
                        evidence=self._history(execution.id),
                    )
            elif execution.id in self.state.busy:
                self._violation(
                    3,
                    f"ended {execution.status}, but its request is still held by it",
                    execution,
                    evidence=self._history(execution.id),
                )
            if execution.status == "SUCCEEDED":
                unfinished = [
                    c.action_id
                    for c in self.state.checkpoints.get(execution.id, [])
                    if c.status != "SUCCEEDED"
                ]
                completions = [
                    row
                    for row in self.state.audit.get(execution.id, [])
                    if row.kind == "TRANSITION_COMPLETED"
                ]
                if unfinished or len(completions) != 1:
                    self._violation(
                        3,
                        f"ended SUCCEEDED with steps {unfinished or 'none'} unfinished and "
                        f"{len(completions)} TRANSITION_COMPLETED rows",
                        execution,
                        evidence=self._history(execution.id),
                    )
        blocked_behind: str | None = None
        for event in self.state.events:
            inserted = event_inserts.get(event.id, "not by the checker")
            if event.processed_at is None:
                self._violation(
                    3,
                    f"platform event {event.id} was never processed"
                    + (f" (it sits behind {blocked_behind})" if blocked_behind else ""),
                    evidence=[f"insert: {inserted}"],
                )
                blocked_behind = blocked_behind or f"the unprocessed event {event.id}"
            elif event.outcome not in ("STARTED", "REJECTED"):
                self._violation(3, f"platform event {event.id} ended {event.outcome}")
        for name, outcome in sorted(event_inserts.items()):
            if outcome != "inserted":
                self.findings.notes.append(f"platform event {name}: {outcome}")

    # --- 4 --------------------------------------------------------------------------

    def no_release_in_doubt(self) -> None:
        for execution in self.state.executions:
            if execution.status not in RELEASED:
                continue
            checkpoints = {c.external_key: c for c in self.state.checkpoints.get(execution.id, [])}
            kinds = {row.kind: row for row in self.state.audit.get(execution.id, [])}
            fail_decision = any(
                row.kind == "RECONCILIATION_RESOLVED" and row.decision == "fail"
                for row in self.state.audit.get(execution.id, [])
            )
            declared = execution.status == "FAILED" and (
                "STEP_ERROR_EXIT" in kinds or fail_decision
            )
            how = (
                "cancelled"
                if execution.status == "CANCELLED"
                else "failed by its error exit or an operator"
                if declared
                else "failed by the engine"
            )
            for key in self._keys(execution.id):
                writes = [
                    x for x in self.ledger[key] if x.route != READS and x.event == "performed"
                ]
                if not writes:
                    continue
                known = key in checkpoints and checkpoints[key].status == "SUCCEEDED"
                if declared and known:
                    continue
                ended = execution.finished_at.timestamp() if execution.finished_at else None
                late = [x for x in writes if ended is not None and x.at > ended]
                self._violation(
                    4,
                    f"{how} (request released) with {len(writes)} write(s) performed under a key "
                    f"whose step is {checkpoints[key].status if key in checkpoints else 'unknown'}"
                    + (f"; {len(late)} landed after the execution ended" if late else ""),
                    execution,
                    key,
                    self._history(execution.id),
                )

    # --- 5 --------------------------------------------------------------------------

    def evidence_names_step(self, api: Api) -> None:
        for execution in self.state.executions:
            if execution.status != "RECONCILIATION_REQUIRED":
                continue
            evidence = api.evidence(execution.id)
            if evidence["execution"]["status"] != "RECONCILIATION_REQUIRED":
                continue  # decided between the two reads: nothing to say
            steps = {s["actionId"]: s for s in evidence["steps"]}
            step = evidence.get("inDoubt")
            reason = evidence.get("reason")
            unsettled = [a for a, s in steps.items() if s["status"] != "SUCCEEDED"]
            if not reason:
                self._violation(
                    5,
                    "the evidence gives no reason",
                    execution,
                    evidence=self._history(execution.id),
                )
            if len(unsettled) > 1:
                self._violation(
                    5,
                    f"{len(unsettled)} steps are unfinished ({', '.join(unsettled)}): the "
                    f"evidence can name only one ({step})",
                    execution,
                    evidence=self._history(execution.id),
                )
            if step is None and unsettled:
                self._violation(
                    5,
                    f"the evidence names no step in doubt (reason {reason}) while "
                    f"{', '.join(unsettled)} did not succeed",
                    execution,
                    evidence=self._history(execution.id),
                )
            elif step is None:
                self.findings.notes.append(
                    f"parked with no step in doubt: {execution.name} {execution.id} reason "
                    f"{reason} (every step SUCCEEDED)"
                )
            elif step not in steps or steps[step]["status"] == "SUCCEEDED":
                self._violation(
                    5,
                    f"the evidence names {step} in doubt, but that step "
                    + ("has no checkpoint" if step not in steps else "SUCCEEDED"),
                    execution,
                    evidence=self._history(execution.id),
                )

    # --- 6 --------------------------------------------------------------------------

    def no_head_of_line_blocking(self, disturbances: ActionLog) -> None:
        recovering = [
            (began - RECOVERY_SECONDS, ended + RECOVERY_SECONDS)
            for began, ended in disturbances.outages
        ] + [(at - RECOVERY_SECONDS, at + RECOVERY_SECONDS) for at in disturbances.kills]
        for (execution_id, action_id), attempts in self.state.attempts.items():
            key = f"{execution_id}:{action_id}"
            for attempt in attempts:
                if attempt.status != "SUCCEEDED" or attempt.finished_at is None:
                    continue
                if (attempt.message or "").startswith("found by lookup"):
                    continue
                committed = attempt.finished_at.timestamp()
                answers = [
                    line.at
                    for line in self.ledger.get(key, [])
                    if line.event == "answered"
                    and not line.lookup
                    and line.at <= committed + CLOCK_MARGIN_SECONDS
                ]
                if not answers or committed - max(answers) < HOL_SECONDS:
                    continue
                answered = max(answers)
                if any(_overlap(w, answered, committed) > 0 for w in recovering):
                    continue
                blockers = [
                    held
                    for held in disturbances.held_locks
                    if held.execution_id != execution_id
                    and _overlap((held.began, held.ended), answered, committed)
                    >= 0.75 * HOL_SECONDS
                ]
                if blockers:
                    held = blockers[0]
                    self._violation(
                        6,
                        f"its success committed {committed - answered:.1f} s after the provider "
                        f"answered, while a stranger held the {held.table} row of execution "
                        f"{held.execution_id} ({_clock(held.began)} to {_clock(held.ended)})",
                        self.by_id.get(execution_id),
                        key,
                        self._history(execution_id, [key]),
                    )


def _overlap(window: tuple[float, float], began: float, ended: float) -> float:
    return max(0.0, min(window[1], ended) - max(window[0], began))


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
