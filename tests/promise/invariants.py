"""The promise's invariants, checked against the database and the provider's ledger.

1. No external key of a NON_IDEMPOTENT_WRITE step was performed twice by the provider.
2. No succeeded step ran again: no call under its key was sent after its SUCCEEDED
   checkpoint committed (the ledger's send times against the checkpoint's and attempt
   history's end times: the same machine, the same clock).
3. Every accepted request ended (SUCCEEDED, FAILED, CANCELLED) or parks
   (RECONCILIATION_REQUIRED) with a reason, its busy marker agreeing; every platform
   event the platform inserted was processed, poison or not. An execution's record
   agrees with itself: one that ended SUCCEEDED has every step SUCCEEDED and one
   TRANSITION_COMPLETED row.
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
6. No head-of-line blocking: see `blocking.py`.
7. A step starts only once the step before it has succeeded: no attempt of a step began
   before the previous step's success ended (SPEC section 15: a riding SUCCEEDED is
   written before the next step's RUNNING in every path, the batch function's included;
   a batch row refused half way, its RUNNING kept and its riding SUCCEEDED lost, shows
   here too; SPEC 28: a step that writes no RUNNING records when its call began and
   ended, so a success held back across it still ends before it began).
8. The keyed writes' route, rate limited, got no more calls than its token bucket
   allows: in any stretch of the run, at most `burst` plus `per_second` calls a second,
   give or take RATE_MARGIN_SECONDS between a token's taking and the call's sending.
9. No machine command was handed to an agent at or after its deliver-by time (SPEC 23),
   and no execution ended CANCELLED, its request released, with a command an agent had
   taken: only a command nobody took may count as a write that did nothing.
10. A finish into a state that continues by itself was continued exactly once (one
   execution names it in `continued_from`, of the transition the flow names), whatever
   was killed or restarted in between; no execution continues one that did not finish
   into such a state.
11. The provider never saw more than a concurrency key's limit of write calls under one
   key's value overlapping in time (a call from its arrival to its last ledger line;
   the value is the one the call itself sent), whatever was killed, frozen, corrected.
12. An operator's decision acts on the park it matched: no bulk item decided an
   execution that somebody else had decided after the bulk was accepted (the park it
   would act on is a later one nobody saw); of two operators deciding one park at
   once, at most one decision applied.
13. No approval was decided after its execution was cancelled (the audit's order) or
   after its deadline passed, or after it expired.
14. A schedule started exactly one execution per fire time (catch-up `all`: no fire time
   skipped between its first and its last), and every execution carrying its data came
   from one of its fire times.
15. A rollout started exactly one child per item, whatever was killed or restarted: one
   execution per item's case, each the child row's and naming the rollout's execution as
   its parent; every item before `next_index` has its row; never more than `batch`
   children running at once; no child started once failures exceeded the budget; once
   its parent stopped waiting, nothing runs and the counters agree with the children.
16. Keys are fair: no execution took its key (its first claim) while an older execution
   of the same key and priority had been waiting since before it and was still waiting.
17. Cancel reaches running work: a cancel of a live execution (a step in flight, or one
   racing an approval's decision or deadline) is never refused 409; a RUNNING one
   answers 200, cancel requested, and the write rule decides how it ends (4).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from datetime import datetime
from itertools import pairwise
from typing import Any

from tests.acceptance.provider_double import CHARGES, READS, WRITES, LedgerLine, ProviderDouble
from tests.promise.adapters import WRITES_RATE_LIMIT
from tests.promise.api import Api, ApiError
from tests.promise.blocking import waits_behind_other_rows
from tests.promise.database import CheckerDatabase
from tests.promise.flows import CONTINUED, steps_of
from tests.promise.records import Findings, Records, Violation, at, sent
from tests.promise.timeline import ActionLog, RaceRun

ACTIVE = ("PENDING", "RUNNING", "RETRY_WAIT", "WAITING")
RELEASED = ("FAILED", "CANCELLED")
# How much later than a checkpoint's commit a call may be stamped and still count as
# sent before it (clock reads on both sides of one machine).
CLOCK_MARGIN_SECONDS = 0.02
# A token is taken before the RUNNING checkpoint is written, the call is stamped as it
# is sent: the time between the two, at most, that the bucket's check forgives.
RATE_MARGIN_SECONDS = 0.5


def check(
    database: CheckerDatabase,
    api: Api,
    provider: ProviderDouble,
    event_inserts: dict[str, str],
    disturbances: ActionLog,
) -> Findings:
    """Every invariant, over what the run left behind."""
    records = Records(database, provider)
    findings = Findings()
    findings.violations += no_double_write(records)
    findings.violations += no_rerun(records)
    findings.violations += ends_or_parks(records)
    findings.violations += events_processed(records, event_inserts)
    findings.violations += no_release_in_doubt(records)
    parked, notes = evidence_names_step(records, api)
    findings.violations += parked
    findings.violations += waits_behind_other_rows(records, disturbances)
    findings.violations += steps_in_order(records)
    findings.violations += rate_limit_held(records)
    findings.violations += commands_never_late(records, disturbances)
    findings.violations += continued_once(records)
    findings.violations += keys_within_limit(records)
    findings.violations += decisions_on_what_was_seen(records, disturbances.races)
    findings.violations += approvals_in_time(records)
    findings.violations += cancels_never_refused(disturbances, records)
    findings.violations += one_execution_per_fire(records)
    findings.violations += rollouts_exactly_once(records)
    findings.violations += keys_taken_oldest_first(records)
    findings.notes += blocked_behind_parks(records)
    findings.notes += notes
    findings.notes += [
        f"platform event {name}: {outcome}"
        for name, outcome in sorted(event_inserts.items())
        if outcome != "inserted"
    ]
    return findings


def no_double_write(records: Records) -> list[Violation]:
    """1: the provider performed each non-idempotent key's write at most once."""
    found: list[Violation] = []
    for key, lines in records.ledger.items():
        performed = [x for x in lines if x.route == CHARGES and x.event == "performed"]
        if len(performed) > 1:
            found.append(
                records.violation(
                    1,
                    f"the provider performed {len(performed)} writes under one key",
                    _execution_of(key),
                    key,
                )
            )
    return found


def no_rerun(records: Records) -> list[Violation]:
    """2: nothing was sent under a step's key once the step had succeeded."""
    found: list[Violation] = []
    for execution_id, checkpoints in records.checkpoints.items():
        for checkpoint in checkpoints:
            ends = [
                a.finished_at
                for a in records.attempts.get((execution_id, checkpoint.action_id), [])
                if a.status == "SUCCEEDED" and a.finished_at is not None
            ]
            if checkpoint.status == "SUCCEEDED" and checkpoint.finished_at is not None:
                ends.append(checkpoint.finished_at)
            if not ends:
                continue
            succeeded = min(ends)
            key = checkpoint.external_key
            later = [
                line
                for line in records.ledger.get(key, [])
                if line.event == "arrived"
                and not line.lookup
                and sent(line) > succeeded.timestamp() + CLOCK_MARGIN_SECONDS
            ]
            if later:
                found.append(
                    records.violation(
                        2,
                        f"{len(later)} call(s) sent after the step's SUCCEEDED checkpoint "
                        f"committed at {at(succeeded)}",
                        execution_id,
                        key,
                    )
                )
    return found


def ends_or_parks(records: Records) -> list[Violation]:
    """3: nothing left under way; parks have a reason and hold their request; ends agree."""
    found: list[Violation] = []
    for execution in records.executions:
        problem = None
        if _waits_for_a_person(records, execution):
            continue  # its key's holders are parked: it waits for their decision, rightly
        if execution.status in ACTIVE:
            problem = f"still {execution.status} after the quiet phase"
        elif execution.status == "RECONCILIATION_REQUIRED" and not execution.error_code:
            problem = "parked with no reason"
        elif execution.status == "RECONCILIATION_REQUIRED" and execution.id not in records.busy:
            problem = "parked, but its request was released"
        elif execution.status != "RECONCILIATION_REQUIRED" and execution.id in records.busy:
            problem = f"ended {execution.status}, but its request is still held by it"
        elif execution.status == "SUCCEEDED":
            unfinished = [
                c.action_id
                for c in records.checkpoints.get(execution.id, [])
                if c.status != "SUCCEEDED"
            ]
            completions = [
                row
                for row in records.audit.get(execution.id, [])
                if row.kind == "TRANSITION_COMPLETED"
            ]
            if unfinished or len(completions) != 1:
                problem = (
                    f"ended SUCCEEDED with steps {unfinished or 'none'} unfinished and "
                    f"{len(completions)} TRANSITION_COMPLETED rows"
                )
        if problem:
            found.append(records.violation(3, problem, execution.id))
    return found


def steps_in_order(records: Records) -> list[Violation]:
    """7: each step started only once the step before it had succeeded."""
    found: list[Violation] = []
    for execution in records.executions:
        steps = steps_of(execution.flow.removeprefix("promise-"), execution.transition_id)
        checkpoints = {c.action_id: c for c in records.checkpoints.get(execution.id, [])}
        early: list[str] = []
        for before, step in zip(steps or (), (steps or ())[1:], strict=False):
            started = [
                a.started_at
                for a in records.attempts.get((execution.id, step.id), [])
                if a.started_at is not None
            ]
            if step.id in checkpoints and checkpoints[step.id].started_at is not None:
                started.append(checkpoints[step.id].started_at)
            if not started:
                continue
            succeeded = [
                a.finished_at
                for a in records.attempts.get((execution.id, before.id), [])
                if a.status == "SUCCEEDED" and a.finished_at is not None
            ]
            previous = checkpoints.get(before.id)
            if previous is not None and previous.status == "SUCCEEDED" and previous.finished_at:
                succeeded.append(previous.finished_at)
            if not succeeded or min(started) < min(succeeded):
                when = f"at {_precise(min(succeeded))}" if succeeded else "never"
                early.append(
                    f"{step.id} started at {_precise(min(started))}, {before.id} succeeded {when}"
                )
        if early:
            found.append(records.violation(7, "; ".join(early), execution.id))
    return found


def continued_once(records: Records) -> list[Violation]:
    """10: every finish into a continuing state has exactly one continuation, of the
    transition the flow names; every continuation continues such a finish."""
    found: list[Violation] = []
    onward: dict[uuid.UUID, list[Any]] = {}
    for execution in records.executions:
        if execution.continued_from is not None:
            onward.setdefault(execution.continued_from, []).append(execution)
    for execution in records.executions:
        continuing = CONTINUED.get(execution.flow.removeprefix("promise-"))
        finished_into = (
            continuing is not None
            and execution.status == "SUCCEEDED"
            and execution.to_state == continuing[0]
        )
        followers = onward.get(execution.id, [])
        problem = None
        if finished_into and len(followers) != 1:
            problem = f"finished into {execution.to_state} and was continued {len(followers)} times"
        elif finished_into and followers[0].transition_id != continuing[1]:
            problem = f"continued with {followers[0].transition_id}, not {continuing[1]}"
        elif not finished_into and followers:
            problem = (
                f"ended {execution.status} in {execution.to_state or 'no state'}, yet "
                f"{len(followers)} execution(s) continue it"
            )
        if problem:
            evidence = records.history(execution.id) + [
                f"continuation {f.id} {f.transition_id} {f.status}" for f in followers
            ]
            found.append(records.violation(10, problem, execution.id, evidence=evidence))
    return found


def events_processed(records: Records, event_inserts: dict[str, str]) -> list[Violation]:
    """3, for the platform's outbox: every inserted event became a request or was rejected."""
    found: list[Violation] = []
    blocked_behind: str | None = None
    for event in records.events:
        inserted = event_inserts.get(event.id, "not by the checker")
        if event.processed_at is None:
            found.append(
                records.violation(
                    3,
                    f"platform event {event.id} was never processed"
                    + (f" (it sits behind {blocked_behind})" if blocked_behind else ""),
                    evidence=[f"insert: {inserted}"],
                )
            )
            blocked_behind = blocked_behind or f"the unprocessed event {event.id}"
        elif event.outcome not in ("STARTED", "REJECTED"):
            found.append(records.violation(3, f"platform event {event.id} ended {event.outcome}"))
    return found


def no_release_in_doubt(records: Records) -> list[Violation]:
    """4: a released request has no write under its execution's keys, known ones aside."""
    found: list[Violation] = []
    for execution in records.executions:
        if execution.status not in RELEASED:
            continue
        checkpoints = {c.external_key: c for c in records.checkpoints.get(execution.id, [])}
        audit = records.audit.get(execution.id, [])
        declared = execution.status == "FAILED" and any(
            row.kind == "STEP_ERROR_EXIT"
            or (row.kind == "RECONCILIATION_RESOLVED" and row.decision == "fail")
            for row in audit
        )
        how = (
            "cancelled"
            if execution.status == "CANCELLED"
            else "failed by its error exit or an operator"
            if declared
            else "failed by the engine"
        )
        for key in records.keys(execution.id):
            writes = [x for x in records.ledger[key] if x.route != READS and x.event == "performed"]
            if not writes:
                continue
            step = checkpoints.get(key)
            if declared and step is not None and step.status == "SUCCEEDED":
                continue
            ended = execution.finished_at.timestamp() if execution.finished_at else None
            late = [x for x in writes if ended is not None and x.at > ended]
            found.append(
                records.violation(
                    4,
                    f"{how} (request released) with {len(writes)} write(s) performed under a key "
                    f"whose step is {step.status if step is not None else 'unknown'}"
                    + (f"; {len(late)} landed after the execution ended" if late else ""),
                    execution.id,
                    key,
                    records.history(execution.id),
                )
            )
    return found


def evidence_names_step(records: Records, api: Api) -> tuple[list[Violation], list[str]]:
    """5: the evidence of every park names its one unfinished step; (violations, notes)."""
    found: list[Violation] = []
    notes: list[str] = []
    for execution in records.executions:
        if execution.status != "RECONCILIATION_REQUIRED":
            continue
        try:
            evidence = api.evidence(execution.id)
        except ApiError as refused:
            found.append(
                records.violation(5, f"the evidence cannot be read: {refused}", execution.id)
            )
            continue
        if evidence["execution"]["status"] != "RECONCILIATION_REQUIRED":
            continue  # decided between the two reads: nothing to say
        steps = {s["actionId"]: s for s in evidence["steps"]}
        step = evidence.get("inDoubt")
        reason = evidence.get("reason")
        unsettled = [a for a, s in steps.items() if s["status"] != "SUCCEEDED"]
        problems = []
        if not reason:
            problems.append("the evidence gives no reason")
        if len(unsettled) > 1:
            problems.append(
                f"{len(unsettled)} steps are unfinished ({', '.join(unsettled)}): the "
                f"evidence can name only one ({step})"
            )
        if step is None and unsettled:
            problems.append(
                f"the evidence names no step in doubt (reason {reason}) while "
                f"{', '.join(unsettled)} did not succeed"
            )
        elif step is None:
            notes.append(
                f"parked with no step in doubt: {execution.name} {execution.id} reason "
                f"{reason} (every step SUCCEEDED)"
            )
        elif step not in steps or steps[step]["status"] == "SUCCEEDED":
            problems.append(
                f"the evidence names {step} in doubt, but that step "
                + ("has no checkpoint" if step not in steps else "SUCCEEDED")
            )
        found += [records.violation(5, problem, execution.id) for problem in problems]
    return found, notes


def rate_limit_held(records: Records) -> list[Violation]:
    """8: no stretch of the run saw more calls to the writes' route than the bucket allows.

    For calls i..j (by send time) the bucket allows burst + per_second * (t_j - t_i);
    the largest excess over every i is kept as a running maximum, so one pass suffices.
    """
    limit = WRITES_RATE_LIMIT
    sends = sorted(
        (
            (x.sent_at or x.at, x)
            for lines in records.ledger.values()
            for x in lines
            if x.route == WRITES and x.event == "arrived" and not x.lookup
        ),
        key=lambda pair: pair[0],
    )
    allowed = limit.burst + limit.per_second * RATE_MARGIN_SECONDS
    best, first = float("-inf"), 0
    for j, (moment, line) in enumerate(sends):
        if limit.per_second * moment - j > best:
            best, first = limit.per_second * moment - j, j
        excess = (j + 1 - limit.per_second * moment) + best
        if excess > allowed:
            calls = j - first + 1
            seconds = moment - sends[first][0]
            evidence = [str(x) for _, x in sends[first : j + 1]]
            return [
                records.violation(
                    8,
                    f"{calls} calls in {seconds:.3f} s where the bucket allows "
                    f"{limit.burst} + {limit.per_second:g}/s",
                    _execution_of(line.key),
                    line.key,
                    evidence,
                )
            ]
    return []


def commands_never_late(records: Records, disturbances: ActionLog) -> list[Violation]:
    """9: nothing handed out past its deliver-by time; no release over a taken command."""
    found: list[Violation] = []
    by_key = {command.external_key: command for command in records.commands}
    for command in records.commands:
        if command.sent_at is not None and command.sent_at >= command.deliver_by:
            found.append(
                records.violation(
                    9,
                    f"command {command.id} handed out at {_precise(command.sent_at)}, its "
                    f"deliver-by time {_precise(command.deliver_by)} passed",
                    _execution_of(command.external_key),
                    command.external_key,
                )
            )
    for handed in disturbances.handed:
        row = next((c for c in records.commands if str(c.id) == handed.command_id), None)
        if row is None or row.sent_at is None:
            found.append(
                records.violation(
                    9, f"the agent of {handed.case} was handed {handed.command_id}, never sent"
                )
            )
    for execution in records.executions:
        if execution.status != "CANCELLED":
            continue
        for key in (c.external_key for c in records.checkpoints.get(execution.id, [])):
            command = by_key.get(key)
            if command is not None and command.sent_at is not None:
                found.append(
                    records.violation(
                        9,
                        f"cancelled (request released) though an agent took its command "
                        f"{command.id} at {_precise(command.sent_at)} ({command.status} now)",
                        execution.id,
                        key,
                        records.history(execution.id),
                    )
                )
    return found


def _waits_for_a_person(records: Records, execution: Any) -> bool:
    """A PENDING execution whose key is full of parked holders (a parked one keeps its key)."""
    if execution.status != "PENDING" or execution.concurrency_key is None:
        return False
    parked = sum(
        1
        for other in records.executions
        if other.status == "RECONCILIATION_REQUIRED"
        and other.concurrency_key == execution.concurrency_key
    )
    return parked >= (execution.concurrency_limit or 1)


def blocked_behind_parks(records: Records) -> list[str]:
    return [
        f"{e.name} {e.id} still PENDING behind its key {e.concurrency_key}'s parked holders"
        for e in records.executions
        if _waits_for_a_person(records, e)
    ]


def keys_within_limit(records: Records) -> list[Violation]:
    """11: per concurrency key value, at most its limit of write calls at any moment."""
    limits = {
        e.concurrency_key: e.concurrency_limit or 1
        for e in records.executions
        if e.concurrency_key is not None
    }
    spans: dict[tuple[str, str, int], list[LedgerLine]] = defaultdict(list)
    for lines in records.ledger.values():
        for line in lines:
            if line.slot and not line.lookup and line.route != READS:
                spans[(line.route, line.key, line.ordinal)].append(line)
    by_slot: dict[str, list[tuple[float, float, list[LedgerLine]]]] = defaultdict(list)
    for lines in spans.values():
        began = min((x.at for x in lines if x.event == "arrived"), default=lines[0].at)
        by_slot[lines[0].slot].append((began, max(x.at for x in lines), lines))
    found: list[Violation] = []
    for slot, calls in sorted(by_slot.items()):
        limit = limits.get(slot, 1)
        calls.sort(key=lambda call: call[0])
        for index, (began, _, lines) in enumerate(calls):
            open_now = [c for c in calls[: index + 1] if c[1] > began]
            if len(open_now) > limit:
                evidence = [str(x) for c in open_now for x in c[2]]
                keys = sorted({c[2][0].key for c in open_now})
                found.append(
                    records.violation(
                        11,
                        f"{len(open_now)} calls under key value {slot} overlapped (limit "
                        f"{limit}): {', '.join(keys)}",
                        _execution_of(lines[0].key),
                        lines[0].key,
                        evidence,
                    )
                )
                break  # one overlap per key value tells the story
    return found


def decisions_on_what_was_seen(records: Records, races: list[RaceRun]) -> list[Violation]:
    """12: bulk items decide the park they matched; two deciders make one decision."""
    found: list[Violation] = []
    for race in races:
        applied = [a for a in race.answers if a.startswith("200")]
        if race.kind == "deciders" and len(applied) > 1:
            found.append(
                records.violation(
                    12,
                    f"two operators deciding one park at once were both applied: {race.answers}",
                    race.execution_id,
                )
            )
    for item in records.bulk_items:
        if item.outcome != "SUCCEEDED":
            continue
        audit = records.audit.get(item.execution_id, [])
        own = [r for r in audit if r.bulk_id == str(item.bulk_id)]
        if not own:
            continue
        between = [
            r
            for r in audit
            if r.kind == "RECONCILIATION_RESOLVED"
            and r.bulk_id != str(item.bulk_id)
            and r.created_at > item.accepted_at
            and r.id < own[0].id
        ]
        if between:
            found.append(
                records.violation(
                    12,
                    f"bulk {item.bulk_id} (accepted {at(item.accepted_at)}) decided a park that "
                    f"began after {len(between)} other decision(s) at "
                    f"{', '.join(at(r.created_at) for r in between)}: a park nobody saw",
                    item.execution_id,
                )
            )
    return found


def cancels_never_refused(disturbances: ActionLog, records: Records) -> list[Violation]:
    """17: no cancel of a live execution answered 409."""
    return [
        records.violation(17, f"a cancel of a live execution was refused: {answer}", execution)
        for _, execution, answer in disturbances.refused_cancels
    ]


def approvals_in_time(records: Records) -> list[Violation]:
    """13: no approval decided after its execution's cancel, its deadline or its expiry."""
    found: list[Violation] = []
    for approval in records.approvals:
        if approval.status not in ("approved", "rejected"):
            continue
        audit = records.audit.get(approval.execution_id, [])
        decided = [r for r in audit if r.kind == "APPROVAL_DECIDED"]
        ended = [r for r in audit if r.kind in ("EXECUTION_CANCELLED", "APPROVAL_EXPIRED")]
        problems = []
        if decided and ended and ended[0].id < decided[0].id:
            problems.append(
                f"{approval.status} at {at(decided[0].created_at)}, after "
                f"{ended[0].kind} at {at(ended[0].created_at)}"
            )
        if approval.decided_at is not None and approval.decided_at > approval.deadline_at:
            problems.append(
                f"{approval.status} at {at(approval.decided_at)}, past its deadline "
                f"{at(approval.deadline_at)}"
            )
        found += [records.violation(13, problem, approval.execution_id) for problem in problems]
    return found


def one_execution_per_fire(records: Records) -> list[Violation]:
    """14: one execution per fire time, fire times without a gap, none from elsewhere."""
    found: list[Violation] = []
    for schedule in records.schedules:
        fires = [f for f in records.fires if f.schedule_id == schedule.id]
        times = [f.fire_time for f in fires]
        problems = []
        gaps = [
            f"{at(a)} -> {at(b)}"
            for a, b in pairwise(times)
            if (b - a).total_seconds() != schedule.every_seconds
        ]
        if gaps:
            problems.append(f"fire times {schedule.every_seconds} s apart but: {', '.join(gaps)}")
        if schedule.missed:
            problems.append(f"{schedule.missed} fire time(s) counted missed under catch-up all")
        started = [f.execution_id for f in fires]
        if None in started or len(set(started)) != len(started):
            problems.append(f"{len(fires)} fire times started {len(set(started) - {None})}")
        carrying = {e.id for e in records.executions if e.name == schedule.id}
        strays = carrying - set(started)
        if strays:
            problems.append(f"{len(strays)} execution(s) carry its data but no fire time")
        found += [
            records.violation(14, f"schedule {schedule.id}: {problem}", evidence=[])
            for problem in problems
        ]
    return found


def rollouts_exactly_once(records: Records) -> list[Violation]:
    """15: one child per item, at most `batch` at once, no start past the budget."""
    found: list[Violation] = []
    for rollout in records.rollouts:
        children = [c for c in records.rollout_children if c.rollout_id == rollout.id]
        problems = []
        indexes = [c.item_index for c in children]
        if sorted(indexes) != list(range(rollout.next_index)):
            problems.append(f"items 0..{rollout.next_index - 1} started as {sorted(indexes)}")
        rows = {c.execution_id for c in children if c.execution_id is not None}
        named = {e.id for e in records.executions if e.parent_execution_id == rollout.execution_id}
        if rows != named:
            problems.append(
                f"{len(named)} executions name it as parent, {len(rows)} children recorded"
            )
        for child in children:
            carrying = [e for e in records.executions if e.name == child.item]
            if len(carrying) != (child.execution_id is not None):
                problems.append(f"item {child.item} has {len(carrying)} executions")

        # Never more than batch at once: each child runs, for its rollout, from its start
        # to its end or its first park (a parked child counts failed and frees its place,
        # whatever a person decides later).
        def stopped(child: Any) -> datetime | None:
            parks = [
                row.created_at
                for row in records.audit.get(child.execution_id, [])
                if row.kind == "RECONCILIATION_REQUIRED"
            ]
            ends = [m for m in (child.ended_at, *parks) if m is not None]
            return min(ends) if ends else None

        spans = [(c.created_at, stopped(c)) for c in children]
        moments = sorted(
            [(began, 1) for began, _ in spans]
            + [(ended, -1) for _, ended in spans if ended is not None]
        )
        running = most = 0
        for _, step in moments:
            running += step
            most = max(most, running)
        if most > rollout.batch:
            problems.append(f"{most} children ran at once (batch {rollout.batch})")
        for child in sorted(children, key=lambda c: c.created_at):
            ended_failing = [
                c
                for c in children
                if c.status in ("failed", "cancelled")
                and c.ended_at is not None
                and c.ended_at < child.created_at
            ]
            if len(ended_failing) > rollout.max_failures:
                problems.append(
                    f"item {child.item} started after {len(ended_failing)} failures "
                    f"(budget {rollout.max_failures})"
                )
                break
        parent = records.by_id.get(rollout.execution_id)
        if parent is not None and parent.status not in ACTIVE:
            statuses = Counter(c.status for c in children)
            counted = {
                "running": rollout.running,
                "succeeded": rollout.succeeded,
                "failed": rollout.failed,
                "cancelled": rollout.cancelled,
            }
            seen = {name: statuses.get(name, 0) for name in counted}
            if rollout.running or counted != seen:
                problems.append(f"its parent ended with counts {counted}, children {seen}")
        evidence = [
            f"child {c.item_index} {c.item} {c.status} {c.execution_id} "
            f"{at(c.created_at)} -> {at(c.ended_at)}"
            for c in children
        ]
        found += [
            records.violation(15, problem, rollout.execution_id, evidence=evidence)
            for problem in problems
        ]
    return found


def keys_taken_oldest_first(records: Records) -> list[Violation]:
    """16: a key goes to its oldest waiter (of the same priority), never to a newer one."""
    found: list[Violation] = []
    keyed: dict[str, list[Any]] = defaultdict(list)
    for execution in records.executions:
        if execution.concurrency_key is not None:
            keyed[execution.concurrency_key].append(execution)
    for key, executions in sorted(keyed.items()):
        for newer in executions:
            if newer.started_at is None:
                continue
            overtaken = [
                older
                for older in executions
                if older.created_at < newer.created_at
                and older.priority == newer.priority
                and (older.started_at is None or older.started_at > newer.started_at)
                and (older.finished_at is None or older.finished_at > newer.started_at)
            ]
            if overtaken:
                found.append(
                    records.violation(
                        16,
                        f"took key {key} at {at(newer.started_at)} while older "
                        + ", ".join(
                            f"{o.name} (accepted {at(o.created_at)}, took it {at(o.started_at)})"
                            for o in overtaken
                        )
                        + " waited",
                        newer.id,
                        evidence=[],
                    )
                )
                break  # one overtaking per key tells the story
    return found


def _precise(moment: datetime) -> str:
    return moment.astimezone().strftime("%H:%M:%S.%f")


def _execution_of(key: str) -> uuid.UUID | None:
    """The execution a key (`<executionId>:<actionId>`) belongs to."""
    try:
        return uuid.UUID(key.split(":", 1)[0])
    except ValueError:
        return None
