"""Invariant 6, no head-of-line blocking: one locked row never stalls other executions.

SPEC section 15 promises it; the checker sees it from outside. Each execution walks its
steps one after another, and between two of its own moments nothing but the engine's
own writes stand: from its acceptance to its first call, from a step's answer (one the
engine heard, inside the adapter's deadline) to the next step's call, from the last
answer to its completion. When such a gap lasts HOL_SECONDS or more, most of it inside
a window where a stranger held *another* execution's row (or its request's), with no
retry, wait, park or decision of its own in between and no outage or kill around it,
the execution waited behind a row it had nothing to do with.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from tests.promise.adapters import TIMEOUT_SECONDS
from tests.promise.flows import steps_of
from tests.promise.records import Records, Violation, at, sent
from tests.promise.timeline import ActionLog, HeldLock
from tests.promise.workers import WORKER_SETTINGS

HOL_SECONDS = 2.0
# A gap that touches a database outage (or the reconnects after it), or the wait for a
# killed worker's leases to run out, is recovery, not blocking.
AFTER_OUTAGE_SECONDS = 3.0
LEASE_SECONDS = float(WORKER_SETTINGS["WORKER_LEASE_SECONDS"])
AFTER_KILL_SECONDS = LEASE_SECONDS + 0.5
# The audit rows an execution's plain run writes; any other one between two moments
# (a retry, a park, a decision, a look-up's finding) explains a gap by itself.
PLAIN = ("TRANSITION_ACCEPTED", "TRANSITION_COMPLETED")


def waits_behind_other_rows(records: Records, disturbances: ActionLog) -> list[Violation]:
    recovering = [
        (began, ended + AFTER_OUTAGE_SECONDS) for began, ended in disturbances.outages
    ] + [(moment, moment + AFTER_KILL_SECONDS) for moment in disturbances.kills]
    # A frozen worker's claims wait for their leases to run out, like a killed one's.
    recovering += [(began, ended + AFTER_KILL_SECONDS) for began, ended in disturbances.pauses]
    found: list[Violation] = []
    for execution in records.executions:
        steps = steps_of(execution.flow.removeprefix("promise-"), execution.transition_id)
        if steps is None:
            continue
        audit = records.audit.get(execution.id, [])
        for began, ended, what in _gaps(records, execution, [s.id for s in steps], audit):
            if ended - began < HOL_SECONDS:
                continue
            if execution.concurrency_key is not None and what.startswith("from its acceptance"):
                continue  # waiting for its key's holders is the key's promise, not blocking
            if any(
                began < _stamp(row.created_at) < ended for row in audit if row.kind not in PLAIN
            ):
                continue
            if any(_overlap(window, began, ended) > 0 for window in recovering):
                continue
            blocker = _blocker(disturbances.held_locks, execution.id, began, ended)
            if blocker is None:
                continue
            found.append(
                records.violation(
                    6,
                    f"{ended - began:.1f} s passed {what} ({at(began)} to {at(ended)}) while a "
                    f"stranger held the {blocker.table} row of execution "
                    f"{blocker.execution_id} ({at(blocker.began)} to {at(blocker.ended)})",
                    execution.id,
                )
            )
    return found


def _gaps(
    records: Records, execution: Any, step_ids: list[str], audit: list[Any]
) -> list[tuple[float, float, str]]:
    """(began, ended, what) between the execution's consecutive moments of its plain run."""
    accepted = [_stamp(r.created_at) for r in audit if r.kind == "TRANSITION_ACCEPTED"]
    completed = [_stamp(r.created_at) for r in audit if r.kind == "TRANSITION_COMPLETED"]
    gaps = []
    previous = (accepted[0], "from its acceptance") if accepted else None
    for step in step_ids:
        lines = records.ledger.get(f"{execution.id}:{step}", [])
        calls = [sent(x) for x in lines if x.event == "arrived" and not x.lookup]
        if previous is not None and calls:
            gaps.append((previous[0], min(calls), f"{previous[1]} to the call of {step}"))
        heard = _answer_heard(lines)
        if heard is None:
            return gaps
        previous = (heard, f"from the answer to {step}")
    if previous is not None and completed:
        gaps.append((previous[0], completed[0], f"{previous[1]} to the completion"))
    return gaps


def _answer_heard(lines: list[Any]) -> float | None:
    """When the first answer with an output reached the caller inside its deadline."""
    arrivals = {x.ordinal: x.at for x in lines if x.event == "arrived" and not x.lookup}
    heard = [
        x.at
        for x in lines
        if x.event == "answered"
        and not x.lookup
        and x.detail.startswith("{")
        and x.at - arrivals.get(x.ordinal, x.at) < TIMEOUT_SECONDS
    ]
    return min(heard) if heard else None


def _blocker(
    held: list[HeldLock], execution_id: uuid.UUID, began: float, ended: float
) -> HeldLock | None:
    """The other execution's lock the gap waited for: the one released nearest its end."""
    # Its own row held during the gap explains it, and so does the lease recovery after
    # it: a job that cannot write its row gives it up and waits for its lease to end.
    if any(
        lock.execution_id == execution_id
        and _overlap((lock.began, lock.ended), began, ended) > 0
        and ended <= lock.ended + LEASE_SECONDS + 1.0
        for lock in held
    ):
        return None
    overlapping = [
        lock
        for lock in held
        if _overlap((lock.began, lock.ended), began, ended) >= 0.75 * HOL_SECONDS
    ]
    if any(lock.execution_id == execution_id for lock in overlapping):
        return None  # its own row was held: that wait is the lock's own effect
    return min(overlapping, key=lambda lock: abs(ended - lock.ended), default=None)


def _overlap(window: tuple[float, float], began: float, ended: float) -> float:
    return max(0.0, min(window[1], ended) - max(window[0], began))


def _stamp(moment: datetime) -> float:
    return moment.timestamp()
