"""The JSON shapes the API answers with, built from database rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row

from orquestador.api.access import KeyWait
from orquestador.domain.mappings import MappingError, build_context, resolve_source
from orquestador.domain.statuses import UNFINISHED, CheckpointStatus, ExecutionStatus, StepStatus
from orquestador.machines.liveness import AgentSeen
from orquestador.machines.output import output_end
from orquestador.queue.claims import ATTEMPT_INTERRUPTED
from orquestador.queue.waits import NOT_READY
from orquestador.tracing import trace_id_of

API_PREFIX = "/api/v1"

# ExecutionView shows at most these keys of execution.result: the business outcome,
# never raw provider output.
_RESULT_KEYS = {"outcome": "outcome", "toState": "toState"}


def timestamp(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z suffix."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def flow_created_view(row: Row, warnings: list[dict[str, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "key": row.key,
        "version": row.version,
        "trigger": row.trigger,
    }
    if warnings:
        body["warnings"] = warnings
    return body


def flow_view(row: Row) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "key": row.key,
        "version": row.version,
        "trigger": row.trigger,
        "createdBy": row.created_by,
        "createdAt": timestamp(row.created_at),
        "definition": row.definition,
    }


def flow_version_view(row: Row) -> dict[str, Any]:
    """One line of the flow listing: which version, not its definition."""
    return {
        "id": str(row.id),
        "key": row.key,
        "version": row.version,
        "trigger": row.trigger,
        "createdAt": timestamp(row.created_at),
    }


def request_view(
    row: Row, *, execution_id: Any = None, busy_execution_id: Any = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "flowId": str(row.flow_id),
        "state": row.state,
        "revision": row.revision,
        "data": row.data,
    }
    if row.machine_id is not None:
        body["machineId"] = row.machine_id
    if execution_id is not None:
        body["executionId"] = str(execution_id)
    # Busy: an unfinished execution holds the request and no transition is accepted.
    body["busy"] = busy_execution_id is not None
    if busy_execution_id is not None:
        body["busyExecutionId"] = str(busy_execution_id)
    return body


@dataclass(frozen=True)
class ExecutionFacts:
    """What the audit froze about an execution, and the commands it names as they are now.

    `observed`: per action, what the step saw when the flow decided (never rewritten).
    `commands`: the current machine_command rows by id, read at view time within the
    caller's organization; an id missing here was purged (or was never the caller's).
    """

    observed: Mapping[str, Any] = field(default_factory=dict)
    commands: Mapping[uuid.UUID, Row] = field(default_factory=dict)
    decision: dict[str, Any] | None = None
    would_have_done: list[dict[str, Any]] = field(default_factory=list)
    # Per waiting action, its deadlineSeconds as the flow resolves it (absent: unknown).
    wait_seconds: Mapping[str, float] = field(default_factory=dict)
    # When the view is read: what "time left" counts from.
    read_at: datetime | None = None
    # What the last cancel did to the execution's machine commands (None: no cancel).
    machine_commands: dict[str, Any] | None = None
    # A PENDING execution's concurrency key, when it waits for a place under it.
    key_wait: KeyWait | None = None
    # The agents of the machines its commands went to, as seen now, by machine id.
    agents: Mapping[str, AgentSeen] = field(default_factory=dict)
    # The attempts whose worker stopped without ending them (ATTEMPT_INTERRUPTED rows).
    interrupted: list[dict[str, Any]] = field(default_factory=list)


# Why an attempt in `interruptedAttempts` ended without an outcome: its holder stopped
# (died, hung or lost its lease) and another took the execution over.
WORKER_STOPPED = "WORKER_STOPPED"

FrozenFacts = tuple[
    dict[str, Any],
    dict[str, Any] | None,
    list[dict[str, Any]],
    dict[str, Any] | None,
    list[dict[str, Any]],
]


def _with_commands(before: dict[str, Any] | None, rows: dict[str, Any]) -> dict[str, Any]:
    """What the cancel rows said of the machine commands so far, with one more row's."""
    if before is None:
        return rows
    merged: dict[str, Any] = {}
    for kind in ("cancelled", "stopRequested"):
        seen = {c.get("id") for c in before.get(kind, [])}
        merged[kind] = [
            *before.get(kind, []),
            *(c for c in rows.get(kind, []) if c.get("id") not in seen),
        ]
    return merged


def read_facts(audit: Iterable[Row]) -> FrozenFacts:
    """(observed per action, the decision, the simulated calls, what a cancel did to the
    machine commands) from one execution's audit.

    The last decision row wins: an execution ends once, but an operator's resolution
    may have sent it round again.
    """
    observed: dict[str, Any] = {}
    decision: dict[str, Any] | None = None
    simulated: list[dict[str, Any]] = []
    machine_commands: dict[str, Any] | None = None
    interrupted: list[dict[str, Any]] = []
    for event in audit:
        detail = event.detail if isinstance(event.detail, dict) else {}
        if event.kind == ATTEMPT_INTERRUPTED:
            # Written by the claim that took over: the attempt as the execution counted it.
            interrupted.append(
                {
                    "attempt": detail.get("attempt"),
                    "why": WORKER_STOPPED,
                    "foundAt": timestamp(event.created_at),
                }
            )
            continue
        if event.kind in (
            "CANCEL_REQUESTED",
            "EXECUTION_CANCELLED",
            ExecutionStatus.RECONCILIATION_REQUIRED,
        ):
            # A cancel's row (ended or parked) lists the commands it cancelled or asked
            # to stop; a worker's park has none. A running one's cancel has two rows (the
            # request, then the holder's), each listing what it did: both count.
            if isinstance(detail.get("machineCommands"), dict):
                machine_commands = _with_commands(machine_commands, detail["machineCommands"])
            continue
        if event.kind == "TRANSITION_CONTINUED":
            # A dry run follows its continuations: the next one is said among what it did.
            simulated.append(
                {
                    "actionId": None,
                    "capability": None,
                    "effect": None,
                    "summary": f"would continue from {detail.get('state')} with"
                    f" {detail.get('transitionId')}",
                    "continuesAs": detail.get("executionId"),
                }
            )
            continue
        if event.kind == "ACTION_SIMULATED":
            item = {
                "actionId": detail.get("actionId"),
                "capability": detail.get("capability"),
                "effect": detail.get("effect"),
                "summary": detail.get("summary"),
            }
            if isinstance(detail.get("wouldSend"), dict):
                item["wouldSend"] = detail["wouldSend"]
            simulated.append(item)
            continue
        if event.kind == "TRANSITION_FAILED":
            # An operator gave up on it: theirs is the last decision; what the steps
            # saw before stays as it was.
            decision = _decision(event.kind, detail)
            continue
        if event.kind not in ("TRANSITION_COMPLETED", "STEP_ERROR_EXIT"):
            continue
        frozen = detail.get("observed")
        observed = dict(frozen) if isinstance(frozen, dict) else {}
        decision = _decision(event.kind, detail)
    return observed, decision, simulated, machine_commands, interrupted


def group_facts(execution_ids: Iterable[Any], audit: Iterable[Row]) -> dict[Any, FrozenFacts]:
    """read_facts of each execution, from one query's audit rows carrying execution_id."""
    by_execution: dict[Any, list[Row]] = {key: [] for key in execution_ids}
    for event in audit:
        by_execution.setdefault(event.execution_id, []).append(event)
    return {key: read_facts(events) for key, events in by_execution.items()}


def command_ids(observed: Mapping[str, Any]) -> list[uuid.UUID]:
    """The machine command ids the observations name; text that is no UUID names none."""
    found: list[uuid.UUID] = []
    for facts in observed.values():
        command_id = _command_id(facts)
        if command_id is not None:
            found.append(command_id)
    return found


def _command_id(facts: Any) -> uuid.UUID | None:
    if not isinstance(facts, dict) or not isinstance(facts.get("commandId"), str):
        return None
    try:
        return uuid.UUID(facts["commandId"])
    except ValueError:
        return None


def _decision(kind: str, detail: dict[str, Any]) -> dict[str, Any]:
    if kind == "TRANSITION_FAILED":
        return {
            "by": "operator",
            "errorCode": detail.get("errorCode"),
            "toState": detail.get("toState"),
            "outcome": "RECONCILED_FAILED",
        }
    if kind == "STEP_ERROR_EXIT":
        # No table decided: the failing step's declared error exit did.
        return {
            "by": "errorExit",
            "actionId": detail.get("actionId"),
            "errorCode": detail.get("errorCode"),
            "toState": detail.get("toState"),
            "outcome": "STEP_ERROR",
        }
    return {
        "by": "rules",
        "hitPolicy": detail.get("hitPolicy"),
        "ruleIds": [r for r in detail.get("ruleIds") or [] if isinstance(r, str)],
        "toState": detail.get("toState"),
        "outcome": detail.get("outcome"),
    }


def _cancel_requested(body: dict[str, Any], row: Row) -> None:
    """A cancel asked while a step's call ran, until its holder applies it (or an
    operator's retry of the park it led to clears it): who asked, and when."""
    requested_at = getattr(row, "cancel_requested_at", None)
    if requested_at is None or row.status not in UNFINISHED:
        return
    body["cancelRequested"] = True
    body["cancelRequestedAt"] = timestamp(requested_at)
    body["cancelRequestedBy"] = row.cancel_requested_by


def execution_view(
    row: Row,
    steps: Iterable[Row],
    attempts: Iterable[Row],
    facts: ExecutionFacts | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "requestId": str(row.request_id),
        "flowId": str(row.flow_id),
        "transitionId": row.transition_id,
        "status": row.status,
    }
    _flow_and_machine(body, row)
    result = row.result if isinstance(row.result, dict) else {}
    for source, target in _RESULT_KEYS.items():
        if result.get(source) is not None:
            body[target] = result[source]
    if row.error_code is not None:
        body["errorCode"] = row.error_code
    if row.error_detail:
        # Where it failed (action, pointer, schema paths); the worker stores no values.
        body["errorDetail"] = row.error_detail
    approval_id = getattr(row, "open_approval_id", None)
    if approval_id is not None:
        body["waitingForApproval"] = str(approval_id)
    for column, key in (
        ("continued_from", "continuedFrom"),
        ("continued_by", "continuedBy"),
        ("parent_execution_id", "parentExecutionId"),
    ):
        # The execution whose finish continued into this one, and the one this one's did.
        value = getattr(row, column, None)
        if value is not None:
            body[key] = str(value)
    _cancel_requested(body, row)
    waiting = row.status == ExecutionStatus.RETRY_WAIT
    if waiting:
        body["nextAttemptAt"] = timestamp(row.next_attempt_at)
    body["attempts"] = row.attempts
    if facts is not None and facts.interrupted:
        body["interruptedAttempts"] = facts.interrupted
    body["priority"] = row.priority
    trace_id = trace_id_of(row.trace_parent)
    if trace_id is not None:
        body["traceId"] = trace_id
    by_action: dict[str, list[Row]] = {}
    for attempt in attempts:
        by_action.setdefault(attempt.action_id, []).append(attempt)
    steps_read = list(steps)
    body["steps"] = [
        _step_view(
            step,
            by_action.get(step.action_id, []),
            row.next_attempt_at if waiting else None,
            paused=row.status in UNFINISHED,
        )
        for step in steps_read
    ]
    if facts is not None:
        for step, checkpoint in zip(body["steps"], steps_read, strict=True):
            _then_and_now(step, facts)
            _waiting_for(step, checkpoint, facts)
        if facts.decision is not None:
            body["decision"] = facts.decision
        if facts.machine_commands is not None:
            body["machineCommands"] = facts.machine_commands
        wait = facts.key_wait
        if (
            row.status == ExecutionStatus.PENDING
            and wait is not None
            and wait.holders >= wait.limit
        ):
            body["blockedBy"] = {
                "key": wait.key,
                "limit": wait.limit,
                "holders": wait.holders,
                "heldBy": [str(holder) for holder in wait.visible],
            }
    if row.simulation:
        body["simulation"] = True
        body["wouldHaveDone"] = facts.would_have_done if facts is not None else []
    body["createdAt"] = timestamp(row.created_at)
    body["updatedAt"] = timestamp(row.updated_at)
    return body


def _then_and_now(step: dict[str, Any], facts: ExecutionFacts) -> None:
    """Beside what the step saw then, the command as it is now (or that it is gone)."""
    seen = facts.observed.get(step["actionId"])
    if seen is None:  # the step saw nothing worth freezing
        return
    step["observed"] = seen
    if not isinstance(seen, dict) or "commandId" not in seen:
        return
    command_id = _command_id(seen)
    now = facts.commands.get(command_id) if command_id is not None else None
    # Never the frozen value as if it were current: no row, no status.
    step["current"] = (
        {
            "status": now.status,
            "updatedAt": timestamp(now.updated_at),
            "deliverBy": timestamp(now.deliver_by),
            **command_output_view(now),
        }
        if now is not None
        else {"purged": True}
    )


def command_output_view(row: Row) -> dict[str, Any]:
    """A command's output as views carry it: its last lines, once there is some."""
    if not row.output_size:
        return {}
    return {
        "output": output_end(
            row.output_head_end or "", row.output_tail_end or "", row.output_dropped
        ),
        "outputBytes": row.output_size,
        "outputTruncated": row.output_dropped > 0,
    }


def _flow_and_machine(body: dict[str, Any], row: Row) -> None:
    """The flow's key and version and the machine, when the row was read with them."""
    for column, key in (
        ("flow_key", "flowKey"),
        ("flow_version", "flowVersion"),
        ("machine_id", "machineId"),
    ):
        value = getattr(row, column, None)
        if value is not None:
            body[key] = value


def _waiting_for(step: dict[str, Any], checkpoint: Row, facts: ExecutionFacts) -> None:
    """What a WAITING step waits for: the command, its machine and status now, the deadline."""
    if step["status"] != StepStatus.WAITING:
        return
    seen = getattr(checkpoint, "observed", None)
    command_id = _command_id(seen)
    if command_id is None:
        return
    waiting: dict[str, Any] = {"commandId": str(command_id)}
    now = facts.commands.get(command_id)
    if now is not None:
        waiting.update(
            machineId=now.machine_id,
            command=now.command,
            args=now.args,
            status=now.status,
            deliverBy=timestamp(now.deliver_by),
            **command_output_view(now),
        )
        agent = facts.agents.get(now.machine_id)
        waiting["agent"] = (agent or AgentSeen(None, None, 0)).as_json()
    else:
        waiting["purged"] = True
    first = _first_start(checkpoint)
    seconds = facts.wait_seconds.get(step["actionId"])
    if first is not None and seconds is not None:
        deadline = first + timedelta(seconds=seconds)
        waiting["deadline"] = timestamp(deadline)
        if facts.read_at is not None:
            left = (deadline - facts.read_at).total_seconds()
            waiting["secondsLeft"] = max(0, int(left))
    step["waitingFor"] = waiting


def wait_seconds(
    definition: Any, transition_id: str, data: Any, action_ids: Iterable[str]
) -> dict[str, float]:
    """deadlineSeconds of each of `action_ids` in the transition, where the flow names it
    as a constant or as a pointer into the request data (an earlier step's output is not
    at hand here: no deadline then, rather than a wrong one)."""
    transitions = definition.get("transitions", []) if isinstance(definition, dict) else []
    actions = next(
        (t.get("actions") or [] for t in transitions if t.get("id") == transition_id), []
    )
    wanted = set(action_ids)
    context = build_context(data, {}, "", "")
    found: dict[str, float] = {}
    for action in actions:
        source = (action.get("input") or {}).get("deadlineSeconds")
        if action.get("id") not in wanted or source is None:
            continue
        try:
            value = resolve_source(source, context)
        except MappingError:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[action["id"]] = float(value)
    return found


def execution_views(
    rows: Iterable[Row],
    steps: Iterable[Row],
    attempts: Iterable[Row],
    facts: Mapping[Any, ExecutionFacts] | None = None,
) -> list[dict[str, Any]]:
    """ExecutionViews of many executions from one query's steps and one query's attempts.

    `steps` and `attempts` carry `execution_id`, and each execution's share keeps the
    order it was read in.
    """
    steps_by_execution: dict[Any, list[Row]] = {}
    for step in steps:
        steps_by_execution.setdefault(step.execution_id, []).append(step)
    attempts_by_execution: dict[Any, list[Row]] = {}
    for attempt in attempts:
        attempts_by_execution.setdefault(attempt.execution_id, []).append(attempt)
    return [
        execution_view(
            row,
            steps_by_execution.get(row.id, []),
            attempts_by_execution.get(row.id, []),
            facts.get(row.id) if facts is not None else None,
        )
        for row in rows
    ]


def evidence_view(
    row: Row,
    checkpoints: list[Row],
    attempts: Iterable[Row],
    audit: Iterable[Row],
    in_doubt: str | None,
    facts: ExecutionFacts | None = None,
) -> dict[str, Any]:
    """What an operator needs to decide: why it parked, each step as the provider saw it.

    Outputs only of SUCCEEDED steps; never inputs (the input hash stands for them), the
    actor snapshot, the lease owner or tokens.
    """
    attempts = list(attempts)
    by_action: dict[str, list[Row]] = {}
    for attempt in attempts:
        by_action.setdefault(attempt.action_id, []).append(attempt)
    parked = row.status == ExecutionStatus.RECONCILIATION_REQUIRED
    return {
        "execution": execution_view(row, checkpoints, attempts, facts),
        "reason": row.error_code if parked else None,
        "inDoubt": in_doubt,
        "steps": [_evidence_step(c, by_action.get(c.action_id, [])) for c in checkpoints],
        "audit": [_audit_view(event) for event in audit],
    }


def _evidence_step(step: Row, ended: list[Row]) -> dict[str, Any]:
    current = next((a for a in ended if a.attempt == step.attempt), None)
    body: dict[str, Any] = {
        "actionId": step.action_id,
        "capability": step.capability,
        "version": step.adapter_version,
        "effect": step.effect,
        "status": step.status,
        "attempt": step.attempt,
        "externalKey": step.external_key,
        "inputHash": step.input_hash,
        "errorCode": step.error_code,
        # The current attempt's own words; None while it runs or when it left none.
        "message": current.message if current is not None else None,
        "startedAt": timestamp(_first_start(step)),
        "finishedAt": timestamp(step.finished_at),
    }
    if step.status == CheckpointStatus.SUCCEEDED:
        body["output"] = step.output
    body["attempts"] = _history(step, ended)
    return body


def _audit_view(event: Row) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": event.kind, "at": timestamp(event.created_at)}
    if event.actor is not None:
        body["actor"] = event.actor
    body["detail"] = event.detail
    return body


def _history(step: Row, ended: list[Row], *, paused: bool = False) -> list[dict[str, Any]]:
    history = [_attempt_view(a) for a in ended]
    # The attempt under way has not ended: not in the history of ended attempts.
    if step.status == CheckpointStatus.RUNNING:
        history.append(
            {
                "attempt": step.attempt,
                "status": StepStatus.RUNNING,
                "startedAt": timestamp(step.started_at),
            }
        )
    elif (
        step.status == CheckpointStatus.FAILED
        and step.error_code == NOT_READY
        and all(a.attempt != step.attempt for a in ended)
    ):
        # A durable wait between its rounds: its attempt is under way (the execution counts
        # it), not missing; or it stopped there when the execution ended. It began with
        # the wait's first round.
        started = _first_start(step) if step.attempt == 1 else step.started_at
        line: dict[str, Any] = {
            "attempt": step.attempt,
            "status": StepStatus.WAITING if paused else StepStatus.STOPPED,
            "startedAt": timestamp(started),
        }
        if not paused and step.finished_at is not None:
            line["finishedAt"] = timestamp(step.finished_at)
        history.append(line)
    return history


def _first_start(step: Row) -> datetime | None:
    """When the step first started: a wait's later rounds and a reclaim restart
    `started_at`, so an 8 s wait would otherwise look as if it took no time."""
    return getattr(step, "first_started_at", None) or step.started_at


def _step_view(
    step: Row, ended: list[Row], next_attempt_at: datetime | None, *, paused: bool = False
) -> dict[str, Any]:
    # Between the rounds of a durable wait the checkpoint rests FAILED with NOT_READY;
    # to a reader of an unfinished execution that step is waiting, not failed. Once the
    # execution ended (cancelled, say) the wait stopped without its answer: not a failure.
    if step.status == CheckpointStatus.FAILED and step.error_code == NOT_READY:
        body: dict[str, Any] = {
            "actionId": step.action_id,
            "status": StepStatus.WAITING if paused else StepStatus.STOPPED,
        }
        if _first_start(step) is not None:
            body["startedAt"] = timestamp(_first_start(step))
        if not paused and step.finished_at is not None:
            body["finishedAt"] = timestamp(step.finished_at)
        body["attempts"] = _history(step, ended, paused=paused)
        return body
    body = {"actionId": step.action_id, "status": step.status}
    if _first_start(step) is not None:
        body["startedAt"] = timestamp(_first_start(step))
    if step.finished_at is not None:
        body["finishedAt"] = timestamp(step.finished_at)
    if step.error_code is not None:
        body["errorCode"] = step.error_code
    body["attempts"] = _history(step, ended)
    if next_attempt_at is not None and step.status in (
        CheckpointStatus.FAILED,
        CheckpointStatus.UNKNOWN,
    ):
        body["nextAttemptAt"] = timestamp(next_attempt_at)
    return body


def _attempt_view(attempt: Row) -> dict[str, Any]:
    body: dict[str, Any] = {
        "attempt": attempt.attempt,
        "status": attempt.status,
        "startedAt": timestamp(attempt.started_at),
    }
    if attempt.finished_at is not None:
        body["finishedAt"] = timestamp(attempt.finished_at)
    if attempt.error_code is not None:
        body["errorCode"] = attempt.error_code
    if attempt.message is not None:
        body["message"] = attempt.message
    return body
