"""An execution's history in words: its audit trail and its attempts, in order.

The execution page reads this timeline from the top: who asked for what, each attempt
with its duration and safe message, retries, waits for rate limits, look-ups,
decisions with their actor and reason, a cancel and what it did on machines, notices
and their e-mail. Only what the audit trail and the attempts record is said; a kind
this module does not know yet is still listed, by its name and its facts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.notices.vocabulary import EmailOutcome, email_outcome_in_words
from orquestador.wording import duration_in_words

# Facts a timeline entry never shows: the frozen evidence is the page's then/now and
# the steps' business, and would drown the sentence.
_BULKY = frozenset({"checkpoints", "observed", "checkpoint", "machineCommands"})


@dataclass(frozen=True)
class Moment:
    """One line of the timeline."""

    at: datetime
    kind: str
    words: str
    actor: str | None = None
    # Further facts as (label, text) pairs: a reason, a safe message, an output.
    facts: tuple[tuple[str, str], ...] = ()


def timeline(
    audit: Iterable[Any],
    attempts: Iterable[Any],
    steps: Iterable[dict[str, Any]] = (),
    flow: str | None = None,
    outputs: bool = True,
) -> list[Moment]:
    """Audit rows (kind, actor, detail, created_at), ended attempts and the waits under
    way (the view's steps with `waitingFor`), oldest first. `flow` ("checkout v3") is the
    flow version the execution runs, which the acceptance names. `outputs` False leaves
    out the step outputs an operator confirmed: a step's output is shown only to those
    who may decide on it, as the evidence is."""
    steps = list(steps)
    # A step's first start: a wait's rounds (and a reclaim) restart the attempt's own
    # start, and a 9 s wait would read as its last round's 19 ms.
    first_starts = {
        s["actionId"]: datetime.fromisoformat(s["startedAt"]) for s in steps if s.get("startedAt")
    }
    moments = [_audit_moment(row, flow, outputs) for row in audit]
    moments += [_attempt_moment(row, first_starts.get(row.action_id)) for row in attempts]
    moments += [_wait_moment(s) for s in steps if "waitingFor" in s and s.get("startedAt")]
    # Stable: an attempt ends before the audit row its outcome wrote in the same instant.
    return sorted(moments, key=lambda moment: moment.at)


def took(started: datetime, finished: datetime | None) -> str:
    """How long something took, as a person says it; sub-second in milliseconds."""
    if finished is None:
        return "no end recorded"
    return _seconds_in_words((finished - started).total_seconds())


def _seconds_in_words(seconds: float) -> str:
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))} ms"
    return duration_in_words(round(seconds))


_ATTEMPT_WORDS = {
    CheckpointStatus.SUCCEEDED: "succeeded",
    CheckpointStatus.FAILED: "failed",
    CheckpointStatus.UNKNOWN: "ended without a known outcome",
}


def _attempt_moment(row: Any, first_start: datetime | None = None) -> Moment:
    ended = (
        "was interrupted" if row.finished_at is None else _ATTEMPT_WORDS.get(row.status, row.status)
    )
    # The first attempt began with the step's first start, whatever rounds came after.
    started = row.started_at
    if row.attempt == 1 and first_start is not None and first_start < started:
        started = first_start
    words = f"Step {row.action_id}, attempt {row.attempt}, {ended}"
    if row.finished_at is not None:
        words += f" after {took(started, row.finished_at)}"
    if row.error_code:
        words += f" ({row.error_code})"
    facts = (("Message", row.message),) if row.message else ()
    return Moment(at=started, kind="attempt", words=words + ".", facts=facts)


def _wait_moment(step: dict[str, Any]) -> Moment:
    waiting = step["waitingFor"]
    if "command" in waiting:
        what = f"command {waiting['command']} on machine {waiting.get('machineId', '?')}"
        what += f" (now {waiting['status']})" if "status" in waiting else ""
    else:
        what = "a command no longer in the records"
    words = f"Step {step['actionId']} waits for {what}"
    if "secondsLeft" in waiting:
        words += f"; {duration_in_words(waiting['secondsLeft'])} left before its deadline"
    return Moment(at=datetime.fromisoformat(step["startedAt"]), kind="wait", words=words + ".")


def _audit_moment(row: Any, flow: str | None = None, outputs: bool = True) -> Moment:
    detail: dict[str, Any] = row.detail if isinstance(row.detail, dict) else {}
    if not outputs:
        detail = {name: value for name, value in detail.items() if name != "output"}
    if row.kind == "TRANSITION_ACCEPTED" and flow is not None:
        detail = {**detail, "flow": flow}
    sentence = _SENTENCES.get(row.kind)
    words = sentence(row.actor or "someone", detail) if sentence else _unknown(row.kind)
    return Moment(
        at=row.created_at,
        kind=row.kind.lower().replace("_", "-"),
        words=words,
        actor=row.actor,
        facts=_facts(row.kind, detail),
    )


def _get(detail: dict[str, Any], name: str, default: str = "?") -> str:
    value = detail.get(name)
    return default if value is None else str(value)


def _commands(detail: dict[str, Any]) -> str:
    said = detail.get("machineCommands") or {}
    cancelled = [c.get("command", "?") for c in said.get("cancelled", [])]
    stopped = [c.get("command", "?") for c in said.get("stopRequested", [])]
    parts = []
    if cancelled:
        parts.append(f"cancelled before any agent took them: {', '.join(cancelled)}")
    if stopped:
        parts.append(f"agents asked to stop: {', '.join(stopped)}")
    return f" On machines, {'; '.join(parts)}." if parts else ""


def _accepted(actor: str, d: dict[str, Any]) -> str:
    revision = d.get("acceptedRevision")
    at_revision = f" at revision {revision}" if revision is not None else ""
    of_flow = f" (flow {d['flow']})" if d.get("flow") else ""
    started_by = d.get("startedBy")
    if isinstance(started_by, dict) and "continuedFrom" in started_by:
        return (
            f"Continued from execution {_short(started_by['continuedFrom'])}, started by"
            f" {actor}: {_get(d, 'transitionId')} from {_get(d, 'fromState')}{at_revision}"
            f"{of_flow}."
        )
    return (
        f"{_starter(actor, d.get('startedBy'))} asked for {_get(d, 'transitionId')}"
        f" from {_get(d, 'fromState')}{at_revision}{of_flow}."
    )


def _starter(actor: str, started_by: Any) -> str:
    """Who asked: the person, or the schedule's fire or platform event that acted for them."""
    if isinstance(started_by, dict) and "schedule" in started_by:
        return f"Schedule {started_by['schedule']}'s fire"
    if isinstance(started_by, dict) and "moment" in started_by:
        plan = f" of plan {started_by['plan']}" if started_by.get("plan") else ""
        return f"Platform event {started_by['moment']}{plan}"
    return actor


def _short(execution_id: Any) -> str:
    """An execution's short id, as the pages' search takes it."""
    return str(execution_id)[:8]


def _continued(actor: str, d: dict[str, Any]) -> str:
    onward = _short(d.get("executionId"))
    if d.get("parked"):
        return (
            f"State {_get(d, 'state')} continues with {_get(d, 'transitionId')}: execution"
            f" {onward} waits for a person, after {_get(d, 'continuations')} continuations"
            " in a row without one."
        )
    return f"State {_get(d, 'state')} continues with {_get(d, 'transitionId')}: execution {onward}."


def _not_continued(actor: str, d: dict[str, Any]) -> str:
    return (
        f"State {_get(d, 'state')} should have continued with {_get(d, 'transitionId')}, but"
        f" it could not be accepted ({_get(d, 'code')}): the request rests in"
        f" {_get(d, 'state')}."
    )


def _completed(actor: str, d: dict[str, Any]) -> str:
    rules = d.get("ruleIds") or []
    matched = f" (rule {', '.join(map(str, rules))})" if rules else ""
    return f"Completed: {_get(d, 'fromState')} → {_get(d, 'toState')}{matched}."


def _parked(actor: str, d: dict[str, Any]) -> str:
    if d.get("reason") == "CONTINUATION_LIMIT":
        return (
            f"Parked before it ran: the request has continued {_get(d, 'continuations')} times"
            f" in a row without a person (the limit is {_get(d, 'limit')}). Retry lets it"
            " run; fail leaves the request where it is."
        )
    if "cancelReason" in d:
        return (
            f"{actor} cancelled it after a write was done or in doubt: it waits for a"
            f" person to say what happened.{_commands(d)}"
        )
    return f"Parked for a person to decide ({_get(d, 'reason')})."


def _resolved(actor: str, d: dict[str, Any]) -> str:
    decided = {"confirm": "confirmed", "retry": "asked for a retry of", "fail": "gave up on"}
    step = d.get("actionId")
    what = f"step {step}" if step else "the execution"
    corrected = " with a correction of the request data" if d.get("correction") else ""
    return f"{actor} {decided.get(str(d.get('decision')), 'decided about')} {what}{corrected}."


def _email(d: dict[str, Any]) -> str:
    return email_outcome_in_words(_get(d, "email"))


_SENTENCES = {
    "TRANSITION_ACCEPTED": _accepted,
    "RETRY_SCHEDULED": lambda actor, d: (
        f"Step {_get(d, 'actionId')} will be tried again in"
        f" {_seconds_in_words(float(d.get('delaySeconds') or 0))}"
        f" ({_get(d, 'errorCode')} on attempt {_get(d, 'attempt')})."
    ),
    "ATTEMPT_INTERRUPTED": lambda actor, d: (
        f"Attempt {_get(d, 'attempt')} was interrupted: its worker stopped before the"
        " attempt ended, and another took the execution over."
    ),
    "RATE_LIMITED": lambda actor, d: (
        f"Step {_get(d, 'actionId')} waited for its route's rate limit; no attempt spent."
    ),
    "RECONCILED_BY_LOOKUP": lambda actor, d: (
        f"A look-up found that step {_get(d, 'actionId')}'s attempt {_get(d, 'attempt')}"
        " had taken effect: it was not sent again."
    ),
    "ACTION_SIMULATED": lambda actor, d: f"Dry run: step {_get(d, 'actionId')} was simulated.",
    "TRANSITION_COMPLETED": _completed,
    "TRANSITION_CONTINUED": _continued,
    "CONTINUATION_REFUSED": _not_continued,
    "STEP_ERROR_EXIT": lambda actor, d: (
        f"Step {_get(d, 'actionId')} failed ({_get(d, 'errorCode')}); its error exit moved"
        f" the request {_get(d, 'fromState')} → {_get(d, 'toState')}."
    ),
    "EXECUTION_FAILED": lambda actor, d: f"Failed ({_get(d, 'errorCode')}).",
    ExecutionStatus.RECONCILIATION_REQUIRED: _parked,
    "RECONCILIATION_RESOLVED": _resolved,
    "TRANSITION_FAILED": lambda actor, d: (
        f"{actor} ended the transition as failed: the request is in {_get(d, 'toState')}."
    ),
    "CANCEL_REQUESTED": lambda actor, d: (
        f"{actor} asked to cancel it while a step's call was running: it stops when the call"
        f" returns.{_commands(d)}"
    ),
    "EXECUTION_CANCELLED": lambda actor, d: (
        f"{actor}'s cancel took effect when the step's call returned.{_commands(d)}"
        if d.get("appliedBy")
        else f"{actor} cancelled it.{_commands(d)}"
    ),
    "NOTICE_WRITTEN": lambda actor, d: f"A notice was written; {_email(d)}.",
    "NOTICE_EMAIL_SETTLED": lambda actor, d: (
        "A notice's e-mail was delivered."
        if d.get("email") == EmailOutcome.DELIVERED
        else "A notice's e-mail could not be delivered."
        if d.get("email") == EmailOutcome.FAILED
        else f"A notice's e-mail settled: {_email(d)}."
    ),
    "APPROVAL_DECIDED": lambda actor, d: f"{actor} {_get(d, 'decision')} the approval.",
    "APPROVAL_EXPIRED": lambda actor, d: "Nobody decided the approval before its deadline.",
}


def _unknown(kind: str) -> str:
    return kind.replace("_", " ").capitalize() + "."


# Facts worth a line of their own, by kind, in the order they are shown.
_FACT_LABELS: dict[str, Sequence[tuple[str, str]]] = {
    "CANCEL_REQUESTED": (("reason", "Reason"),),
    "EXECUTION_CANCELLED": (("reason", "Reason"),),
    ExecutionStatus.RECONCILIATION_REQUIRED: (("cancelReason", "Reason"),),
    "RECONCILIATION_RESOLVED": (("reason", "Reason"), ("output", "Output")),
    "STEP_ERROR_EXIT": (("message", "Message"),),
    "CONTINUATION_REFUSED": (("message", "Why"),),
    "APPROVAL_DECIDED": (("comment", "Comment"),),
    "APPROVAL_EXPIRED": (("deadlineAt", "Deadline"),),
    "RATE_LIMITED": (("dueAt", "Due again"),),
}


def _facts(kind: str, detail: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    labels = _FACT_LABELS.get(kind)
    if labels is None:
        if kind in _SENTENCES:
            return ()
        # A kind not worded yet: its facts as they are, minus the bulky evidence.
        return tuple(
            (name, _text(value)) for name, value in sorted(detail.items()) if name not in _BULKY
        )
    facts = tuple(
        (label, _when(detail[name]) if name.endswith("At") else _text(detail[name]))
        for name, label in labels
        if detail.get(name)
    )
    # A retry with a correction: each corrected path, what it was and what it became.
    for corrected in detail.get("correction") or ():
        before = _text(corrected["before"]) if "before" in corrected else "(absent)"
        facts += (
            (f"Corrected {corrected.get('path')}", f"{before} → {_text(corrected.get('after'))}"),
        )
    return facts


def _when(value: Any) -> str:
    """A timestamp fact as the pages show times: UTC to the second."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return _text(value)
    if moment.tzinfo is None:
        return _text(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _text(value: Any) -> str:
    return (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )
