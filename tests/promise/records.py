"""What the checks read after a run (the database once, the provider's ledger), and what
they report: violations with the lines that prove them."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.acceptance.provider_double import LedgerLine, ProviderDouble
from tests.promise.database import CheckerDatabase

NAMES = {
    1: "no external key written twice by a non-idempotent step",
    2: "no succeeded step re-run",
    3: "every accepted request ends or parks with a reason",
    4: "no request released while a write is in doubt",
    5: "every parked execution's evidence names the step in doubt",
    6: "no head-of-line blocking behind another execution's locked row",
    7: "a step starts only once the step before it has succeeded",
    8: "a rate-limited route gets no more calls than its limit allows",
    9: "no command handed out past its deliver-by time, no release over a taken command",
    10: "a finish into a continuing state continues exactly once, and nothing else continues",
    11: "the provider never sees more than a key's limit of overlapping calls under it",
    12: "an operator's decision acts on the park it matched, and two deciders make one",
    13: "no approval decided after its execution's cancel, its deadline or its expiry",
    14: "a schedule starts exactly one execution per fire time, and skips none",
    15: "a rollout starts exactly one child per item, at most its batch at once, within budget",
    16: "a key's waiters start oldest first: no execution overtakes an older one of its key",
    17: "a cancel of a live execution is requested, never refused",
}


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


class Records:
    """The database as the run left it and the provider's ledger, indexed for the checks."""

    def __init__(self, database: CheckerDatabase, provider: ProviderDouble) -> None:
        self.executions = database.rows(
            """SELECT e.id, e.request_id, e.status, e.error_code, e.finished_at, e.attempts,
                      f.key AS flow, coalesce(r.data->>'case', r.machine_id) AS name,
                      e.transition_id, e.continued_from, e.result->>'toState' AS to_state,
                      e.concurrency_key, e.concurrency_limit, e.created_at,
                      e.parent_execution_id, e.started_at, e.priority
               FROM execution e JOIN request r ON r.id = e.request_id
                    JOIN flow f ON f.id = e.flow_id
               ORDER BY 8, e.created_at"""
        )
        self.by_id = {e.id: e for e in self.executions}
        self.checkpoints: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for row in database.rows(
            """SELECT execution_id, action_id, status, effect, external_key, attempt,
                      error_code, started_at, finished_at
               FROM action_execution ORDER BY started_at"""
        ):
            self.checkpoints[row.execution_id].append(row)
        self.attempts: dict[tuple[uuid.UUID, str], list[Any]] = defaultdict(list)
        for row in database.rows(
            """SELECT execution_id, action_id, attempt, status, error_code, message,
                      started_at, finished_at
               FROM action_attempt ORDER BY execution_id, action_id, attempt"""
        ):
            self.attempts[(row.execution_id, row.action_id)].append(row)
        self.audit: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for row in database.rows(
            """SELECT id, execution_id, kind, actor, created_at,
                      detail->>'decision' AS decision, detail->>'reason' AS reason,
                      detail->>'errorCode' AS error_code, detail->>'bulkId' AS bulk_id
               FROM audit_event WHERE execution_id IS NOT NULL ORDER BY id"""
        ):
            self.audit[row.execution_id].append(row)
        self.busy = {
            row.busy_execution_id: row.id
            for row in database.rows(
                "SELECT id, busy_execution_id FROM request WHERE busy_execution_id IS NOT NULL"
            )
        }
        # Never the data: a poison event's is too deep to decode.
        self.events = database.rows(
            "SELECT id, outcome, processed_at, execution_id FROM platform_event"
            " ORDER BY received_at"
        )
        self.commands = database.rows(
            "SELECT id, external_key, status, sent_at, deliver_by FROM machine_command"
            " ORDER BY created_at"
        )
        self.approvals = database.rows(
            "SELECT id, execution_id, status, decided_at, deadline_at FROM approval"
        )
        self.schedules = database.rows("SELECT id, every_seconds, missed FROM schedule")
        self.fires = database.rows(
            "SELECT schedule_id, fire_time, execution_id FROM schedule_fire ORDER BY fire_time"
        )
        self.bulk_items = database.rows(
            """SELECT i.bulk_id, i.execution_id, i.outcome, i.code, i.finished_at,
                      b.created_at AS accepted_at
               FROM bulk_item i JOIN bulk_action b ON b.id = i.bulk_id"""
        )
        self.rollouts = database.rows(
            """SELECT id, execution_id, total, batch, max_failures, next_index, running,
                      succeeded, failed, cancelled FROM rollout"""
        )
        self.rollout_children = database.rows(
            """SELECT rollout_id, item_index, item #>> '{}' AS item, execution_id, status,
                      created_at, ended_at
               FROM rollout_child ORDER BY rollout_id, item_index"""
        )
        self.ledger: dict[str, list[LedgerLine]] = defaultdict(list)
        for line in provider.ledger():
            self.ledger[line.key].append(line)

    def keys(self, execution_id: uuid.UUID) -> list[str]:
        """Every key of the execution the provider heard of."""
        prefix = f"{execution_id}:"
        return sorted(key for key in self.ledger if key.startswith(prefix))

    def violation(
        self,
        invariant: int,
        message: str,
        execution_id: uuid.UUID | None = None,
        key: str = "",
        evidence: list[str] | None = None,
    ) -> Violation:
        """A violation about an execution, with its history (or `evidence`) as proof."""
        execution = self.by_id.get(execution_id) if execution_id is not None else None
        if evidence is None:
            evidence = self.history(execution_id, [key] if key else None) if execution_id else []
        return Violation(
            invariant,
            message,
            execution_id,
            execution.name if execution is not None else "",
            key,
            tuple(evidence),
        )

    def history(self, execution_id: uuid.UUID, keys: list[str] | None = None) -> list[str]:
        """The execution's checkpoints, attempts and audit rows, and the ledger of its keys."""
        lines = []
        execution = self.by_id.get(execution_id)
        if execution is not None:
            lines.append(
                f"execution {execution.status} {execution.error_code or ''} (flow "
                f"{execution.flow}, {execution.attempts} claims, "
                f"ended {at(execution.finished_at)})"
            )
        for checkpoint in self.checkpoints.get(execution_id, []):
            lines.append(
                f"checkpoint {checkpoint.action_id} {checkpoint.effect} {checkpoint.status} "
                f"{checkpoint.error_code or ''} attempt {checkpoint.attempt} "
                f"ended {at(checkpoint.finished_at)}"
            )
            for attempt in self.attempts.get((execution_id, checkpoint.action_id), []):
                lines.append(
                    f"  attempt {attempt.attempt}: {attempt.status} {attempt.error_code or ''} "
                    f"{at(attempt.started_at)} -> {at(attempt.finished_at)} "
                    f"{(attempt.message or '')[:120]}"
                )
        for row in self.audit.get(execution_id, []):
            extra = " ".join(
                str(v) for v in (row.decision, row.reason, row.error_code) if v is not None
            )
            bulk = f" bulk {row.bulk_id}" if row.bulk_id else ""
            lines.append(f"audit {at(row.created_at)} {row.kind} {row.actor or ''} {extra}{bulk}")
        for key in keys if keys is not None else self.keys(execution_id):
            lines += [f"ledger {line}" for line in self.ledger.get(key, [])]
        return lines


def at(moment: datetime | float | None) -> str:
    """A moment as the ledger prints it (local time, milliseconds)."""
    if moment is None:
        return "-"
    if isinstance(moment, float):
        moment = datetime.fromtimestamp(moment)
    return moment.astimezone().strftime("%H:%M:%S.%f")[:-3]


def sent(line: LedgerLine) -> float:
    """When the caller sent the request (its own stamp), else when it arrived."""
    return line.sent_at or line.at
