"""Bulk actions by query: accepting a bulk with its items fixed, acting on its items, progress.

A bulk's items are the executions its filter matched when it was accepted, written by
the statement that accepts it: the set never changes afterwards, whatever happens to
the executions. The worker acts on one item per transaction: it takes the item FOR
UPDATE SKIP LOCKED among those with no outcome, acts on the execution through the
function the single-execution route uses (a cancel, or a retry or fail decision), under
the same rules, and writes the item's outcome in that same transaction. So:

- a worker killed mid-item leaves the item without an outcome, and what it did to the
  execution is rolled back with it: the next worker acts on it as for the first time;
- an item with an outcome is never taken again: no item is acted on twice;
- two workers on one bulk never take the same item (SKIP LOCKED), and a transaction
  holds the locks of one execution only, for as long as one cancel or decision takes.

A decision item (retry, fail) acts only on the episode the bulk matched: each item keeps
the execution's `updated_at` as the accepting statement saw it, and an execution changed
since (parked again, decided by someone else) is refused STALE_ITEM, so a bulk never
decides about a doubt nobody saw. A cancel item acts on the execution as it is then: the
cancel's write rule judges what it finds, parking instead of releasing after any write.

An item the rules refuse (an ended execution cannot be cancelled; only a parked one can
be retried or failed) is recorded REFUSED with its problem code; a cancel the write rule
turns into a park for an operator is recorded PARKED, CANCELLED_AFTER_WRITES, with what
became of its machine commands in words: it took effect, it was not refused. A cancel of
a RUNNING execution is recorded SUCCEEDED with words (the only success that has any):
the cancel is requested, and its worker applies it when the step's call returns. Nothing
is ever forced.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    case,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError

from orquestador import metrics
from orquestador.db.schema import (
    action_attempt,
    action_execution,
    bulk_action,
    bulk_item,
    machine_command,
)
from orquestador.domain.statuses import (
    BulkAction,
    BulkItemOutcome,
    BulkStatus,
    CheckpointStatus,
    CommandStatus,
    ExecutionStatus,
)
from orquestador.errors import DecisionInvalid, OrquestadorError
from orquestador.machines.cancel import CancelledCommands
from orquestador.queue.reconciliation import (
    CANCEL_REQUESTABLE,
    CANCEL_REQUESTED_WORDS,
    CANCELLED_AFTER_WRITES,
    Cancelled,
    Resolution,
    cancel_in_transaction,
    resolve_in_transaction,
)

log = logging.getLogger(__name__)

# A bulk holds at most this many items: past it, the operator narrows the filter.
MAX_ITEMS = 100_000
# The code of an item whose action failed in a way no rule names (a flow that no longer
# loads, a bug): recorded, so that one such item never stalls the rest of its bulk.
ITEM_FAILED = "BULK_ITEM_FAILED"
# Where a walk through a bulk's items starts: below every execution id.
_START = uuid.UUID(int=0)

# Called inside an item's transaction once the item is taken, before it is acted on:
# tests hold a worker there.
ItemHook = Callable[["RunningBulk", uuid.UUID], None]


@dataclass(frozen=True)
class BulkRequest:
    """What an operator asked for; the items are what the caller's query selects."""

    org_id: str
    actor: str
    action: str  # cancel | retry | fail
    reason: str
    filter: dict[str, Any]


@dataclass(frozen=True)
class RunningBulk:
    """A bulk the worker is working through."""

    id: uuid.UUID
    org_id: str
    actor: str
    action: str
    reason: str


@dataclass(frozen=True)
class ItemOutcome:
    """What became of one item: SUCCEEDED, PARKED or REFUSED (with the problem's code)."""

    execution_id: uuid.UUID
    outcome: str
    code: str | None = None
    detail: str | None = None
    # The execution's status after the action, when it was applied.
    status: str | None = None


@dataclass(frozen=True)
class RefusedItem:
    execution_id: uuid.UUID
    code: str
    detail: str | None


@dataclass(frozen=True)
class BulkProgress:
    """A bulk as GET /bulk/{id} shows it."""

    id: uuid.UUID
    action: str
    actor: str
    reason: str
    filter: dict[str, Any]
    status: str
    total: int
    done: int
    succeeded: int
    # The items the rules refused, in execution id order.
    refused: list[RefusedItem]
    # The cancels the write rule turned into a park for an operator's decision: acted
    # on, not refused (their machine commands were withdrawn or asked to stop).
    parked: list[RefusedItem]
    # The cancels of RUNNING executions, requested: each stops when its step's call returns.
    cancel_requested: list[uuid.UUID]
    created_at: datetime
    finished_at: datetime | None


# --- accepting ------------------------------------------------------------------------


def accept_bulk(
    conn: Connection, bulk: BulkRequest, matching: Select[Any], *, max_items: int = MAX_ITEMS
) -> tuple[uuid.UUID | None, int]:
    """Record the bulk and its items in one statement; its id and how many items it has.

    `matching` selects two columns, the execution ids and their `updated_at`, with the
    caller's visibility in its WHERE (the API builds it with ResourceAccess); each item
    keeps the second as the execution it saw. One statement reads the matches
    once (a CTE referenced twice is computed once), so the total and the items agree. A
    bulk that matched nothing is DONE at once; one that matched more than `max_items` (the
    organization's quota bulkItems) is not written: the id is None, and the count says how
    many matched.
    """
    matched = matching.cte("matched")
    counted = select(func.count()).select_from(matched).scalar_subquery()
    empty = counted == 0
    accepted = (
        insert(bulk_action)
        .from_select(
            ["org_id", "actor", "action", "reason", "filter", "total", "status", "finished_at"],
            select(
                literal(bulk.org_id),
                literal(bulk.actor),
                literal(bulk.action),
                literal(bulk.reason),
                literal(bulk.filter, bulk_action.c.filter.type),
                counted,
                _case(empty, BulkStatus.DONE.value, BulkStatus.RUNNING.value),
                _case(empty, func.clock_timestamp(), None),
            ).where(counted <= max_items),
        )
        .returning(bulk_action.c.id, bulk_action.c.total)
        .cte("accepted")
    )
    items = (
        insert(bulk_item)
        .from_select(
            ["bulk_id", "execution_id", "seen_updated_at"],
            select(accepted.c.id, matched.c[0], matched.c[1]).select_from(
                accepted.join(matched, literal(True))
            ),
        )
        .returning(bulk_item.c.execution_id)
        .cte("items")
    )
    row = conn.execute(
        select(
            select(accepted.c.id).scalar_subquery().label("bulk_id"),
            counted.label("total"),
            select(func.count()).select_from(items).scalar_subquery().label("written"),
        )
    ).one()
    if row.bulk_id is not None and row.written != row.total:
        raise RuntimeError(f"bulk {row.bulk_id}: {row.total} matched, {row.written} written")
    return row.bulk_id, row.total


def _case(condition: Any, when_true: Any, when_false: Any) -> Any:
    return case((condition, when_true), else_=when_false)


# --- acting ---------------------------------------------------------------------------

_RUNNING_BULKS = text(
    f"""
    SELECT id, org_id, actor, action, reason
    FROM bulk_action WHERE status = '{BulkStatus.RUNNING}'
    ORDER BY created_at, id
    """
)

# The next item after `after` that has no outcome and no other worker holds; the walk
# goes up the pending index, so the items already done cost nothing to pass.
_TAKE_ITEM = text(
    """
    SELECT execution_id, seen_updated_at FROM bulk_item
    WHERE bulk_id = :bulk_id AND outcome IS NULL AND execution_id > :after
    ORDER BY execution_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
    """
)

# Written once: the item is locked by this transaction and has no outcome yet.
_RECORD = text(
    """
    UPDATE bulk_item
    SET outcome = :outcome, code = :code, detail = :detail, finished_at = clock_timestamp()
    WHERE bulk_id = :bulk_id AND execution_id = :execution_id AND outcome IS NULL
    """
)

# Done once no item is left without an outcome. Every worker checks after committing its
# own last item, so the one that commits last sees every other's and ends the bulk.
_FINISH = text(
    f"""
    UPDATE bulk_action SET status = '{BulkStatus.DONE}', finished_at = clock_timestamp()
    WHERE id = :bulk_id AND status = '{BulkStatus.RUNNING}'
      AND NOT EXISTS (SELECT 1 FROM bulk_item WHERE bulk_id = :bulk_id AND outcome IS NULL)
    RETURNING id
    """
)


def running_bulks(conn: Connection) -> list[RunningBulk]:
    with conn.begin():
        return [RunningBulk(*row) for row in conn.execute(_RUNNING_BULKS)]


def act_on_next_item(
    conn: Connection,
    bulk: RunningBulk,
    *,
    after: uuid.UUID = _START,
    claims_budget: int,
    on_taken: ItemHook | None = None,
) -> ItemOutcome | None:
    """Take the bulk's next free item after `after`, act on it and record its outcome, in
    one transaction; None when no item after `after` is free."""
    with conn.begin():
        item = conn.execute(_TAKE_ITEM, {"bulk_id": bulk.id, "after": after}).first()
        if item is None:
            return None
        execution_id = item.execution_id
        if on_taken is not None:
            on_taken(bulk, execution_id)
        outcome = _act(conn, bulk, execution_id, item.seen_updated_at, claims_budget)
        recorded = conn.execute(
            _RECORD,
            {
                "bulk_id": bulk.id,
                "execution_id": execution_id,
                "outcome": outcome.outcome,
                "code": outcome.code,
                "detail": outcome.detail,
            },
        ).rowcount
        if recorded != 1:  # the item is locked by this transaction: cannot happen
            raise RuntimeError(f"bulk {bulk.id}: item {execution_id} had an outcome already")
    _count(bulk, outcome)
    return outcome


def _act(
    conn: Connection,
    bulk: RunningBulk,
    execution_id: uuid.UUID,
    seen_updated_at: datetime | None,
    budget: int,
) -> ItemOutcome:
    """The item's action in a savepoint: a refusal leaves nothing of it behind."""
    try:
        cancelled: Cancelled | None = None
        with conn.begin_nested():
            if bulk.action == BulkAction.CANCEL:
                cancelled = cancel_in_transaction(
                    conn, execution_id, bulk.org_id, bulk.actor, bulk.reason, bulk_id=bulk.id
                )
                status = cancelled.status
            else:
                resolution = Resolution(
                    execution_id=execution_id,
                    org_id=bulk.org_id,
                    actor=bulk.actor,
                    decision=bulk.action,
                    reason=bulk.reason,
                    bulk_id=bulk.id,
                    seen_updated_at=seen_updated_at,
                )
                status = resolve_in_transaction(
                    conn, resolution, output_problems=_no_output, claims_budget=budget
                )
    except OrquestadorError as refused:
        return ItemOutcome(execution_id, BulkItemOutcome.REFUSED, refused.code, refused.message)
    except DBAPIError:
        raise  # the database's trouble, not the item's: the transaction is retried whole
    except Exception as failed:
        log.exception(
            "bulk item failed; recorded as %s",
            ITEM_FAILED,
            extra={"bulk_id": str(bulk.id), "execution_id": str(execution_id)},
        )
        return ItemOutcome(
            execution_id, BulkItemOutcome.REFUSED, ITEM_FAILED, type(failed).__name__
        )
    if cancelled is not None and cancelled.requested:
        # Acted on as asked; the only success with words: its worker applies it later.
        return ItemOutcome(
            execution_id, BulkItemOutcome.SUCCEEDED, detail=CANCEL_REQUESTED_WORDS, status=status
        )
    if status == ExecutionStatus.RECONCILIATION_REQUIRED and cancelled is not None:
        return ItemOutcome(
            execution_id,
            BulkItemOutcome.PARKED,
            CANCELLED_AFTER_WRITES,
            parked_words(cancelled.commands),
            status,
        )
    return ItemOutcome(execution_id, BulkItemOutcome.SUCCEEDED, status=status)


def parked_words(commands: CancelledCommands) -> str:
    """What a cancel that parked did, as the bulk's item says it."""
    done = [
        f"{count} machine command{'s' if count != 1 else ''} {what}"
        for count, what in (
            (len(commands.cancelled), "withdrawn"),
            (len(commands.stop_requested), "asked to stop"),
        )
        if count
    ]
    said = "parked for a decision: a write was done or may have been"
    return f"{said}; {', '.join(done)}" if done else said


def parks_on_cancel(execution_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether a cancel of this execution, were it made now, would park it rather than
    end it: the write rule of cancel_in_transaction, read without locks (for a preview).

    A write done (a step SUCCEEDED that is not a machine command no agent ever took)
    or in doubt (RUNNING, UNKNOWN, or an unsettled UNKNOWN attempt) parks it.
    """
    step, attempt, command = (
        action_execution.alias("step"),
        action_attempt.alias("doubt"),
        machine_command.alias("untaken"),
    )
    # Withdrawn by the cancel itself (pending), or final without ever being handed out.
    untaken = exists().where(
        command.c.external_key == step.c.external_key,
        command.c.sent_at.is_(None),
        command.c.status.in_(
            (CommandStatus.PENDING, CommandStatus.CANCELLED, CommandStatus.EXPIRED)
        ),
    )
    in_doubt = exists().where(
        attempt.c.execution_id == step.c.execution_id,
        attempt.c.action_id == step.c.action_id,
        attempt.c.attempt > step.c.attempt_base,
        attempt.c.status == CheckpointStatus.UNKNOWN,
    )
    return exists().where(
        step.c.execution_id == execution_id,
        step.c.effect != "READ_ONLY",
        or_(
            and_(
                step.c.status == CheckpointStatus.SUCCEEDED,
                ~and_(step.c.capability == "machine.command", untaken),
            ),
            step.c.status.in_((CheckpointStatus.RUNNING, CheckpointStatus.UNKNOWN)),
            and_(step.c.status != CheckpointStatus.SUCCEEDED, in_doubt),
        ),
    )


def _no_output(capability: str, version: int, output: Any) -> list[str]:
    # A bulk never confirms (confirming needs each step's own output).
    raise DecisionInvalid("DECISION_UNKNOWN", "a bulk action cannot confirm")


def _count(bulk: RunningBulk, outcome: ItemOutcome) -> None:
    # As the single-execution routes count: every cancel, and a decision that failed one.
    # A cancel requested of a RUNNING execution moved nothing yet: its worker counts it.
    if outcome.status not in (None, CANCEL_REQUESTABLE) and (
        bulk.action == BulkAction.CANCEL or outcome.status == ExecutionStatus.FAILED
    ):
        metrics.count_move(outcome.status)


def finish_if_done(conn: Connection, bulk_id: uuid.UUID) -> bool:
    """DONE when every item has its outcome; True when this call ended the bulk."""
    with conn.begin():
        return conn.execute(_FINISH, {"bulk_id": bulk_id}).first() is not None


@dataclass
class BulkWalk:
    """Where one worker is in each running bulk: the last item it acted on.

    Each walk continues from there, so the items behind it are never looked at again;
    at the end it starts once more from the beginning, for items another worker held
    when it passed them and gave back without an outcome (it died).
    """

    after: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)


def act_on_chunk(
    engine: Engine,
    walk: BulkWalk,
    *,
    claims_budget: int,
    chunk_items: int,
    stop: threading.Event | None = None,
    on_taken: ItemHook | None = None,
) -> int:
    """Act on up to `chunk_items` items of the running bulks, oldest bulk first, each item
    in a transaction of its own; end the bulks that have no item left. How many acted on."""
    acted = 0
    with engine.connect() as conn:
        for bulk in running_bulks(conn):
            after = walk.after.get(bulk.id, _START)
            while acted < chunk_items and not (stop is not None and stop.is_set()):
                outcome = act_on_next_item(
                    conn, bulk, after=after, claims_budget=claims_budget, on_taken=on_taken
                )
                if outcome is None:
                    if after == _START:
                        break
                    after = _START  # once more from the beginning
                    continue
                after = outcome.execution_id
                acted += 1
            walk.after[bulk.id] = after
            # Also after a full chunk: its last item may have been the bulk's last.
            if finish_if_done(conn, bulk.id):
                walk.after.pop(bulk.id, None)
                log.info("bulk action done", extra={"bulk_id": str(bulk.id)})
            if acted >= chunk_items or (stop is not None and stop.is_set()):
                break
    return acted


# --- reading --------------------------------------------------------------------------

_PROGRESS = text(
    f"""
    SELECT b.id, b.action, b.actor, b.reason, b.filter, b.status, b.total, b.created_at,
           b.finished_at,
           count(i.outcome) AS done,
           count(*) FILTER (WHERE i.outcome = '{BulkItemOutcome.SUCCEEDED}') AS succeeded
    FROM bulk_action b LEFT JOIN bulk_item i ON i.bulk_id = b.id
    WHERE b.id = :bulk_id AND b.org_id = :org_id
    GROUP BY b.id
    """
)

_NOT_AS_ASKED = text(
    f"""
    SELECT execution_id, outcome, code, detail FROM bulk_item
    WHERE bulk_id = :bulk_id
      AND (outcome IN ('{BulkItemOutcome.REFUSED}', '{BulkItemOutcome.PARKED}')
           OR (outcome = '{BulkItemOutcome.SUCCEEDED}' AND detail IS NOT NULL))
    ORDER BY execution_id
    """
)


def bulk_progress(conn: Connection, bulk_id: uuid.UUID, org_id: str) -> BulkProgress | None:
    """The bulk of this organization with this id, or None (a foreign one is as missing).

    Call in one snapshot (REPEATABLE READ), so that the counts and the list agree.
    """
    row = conn.execute(_PROGRESS, {"bulk_id": bulk_id, "org_id": org_id}).first()
    if row is None:
        return None
    others = conn.execute(_NOT_AS_ASKED, {"bulk_id": bulk_id}).all()
    refused = [
        RefusedItem(item.execution_id, item.code, item.detail)
        for item in others
        if item.outcome == BulkItemOutcome.REFUSED
    ]
    parked = [
        RefusedItem(item.execution_id, item.code, item.detail)
        for item in others
        if item.outcome == BulkItemOutcome.PARKED
    ]
    return BulkProgress(
        id=row.id,
        action=row.action,
        actor=row.actor,
        reason=row.reason,
        filter=row.filter,
        status=row.status,
        total=row.total,
        done=row.done,
        succeeded=row.succeeded,
        refused=refused,
        parked=parked,
        cancel_requested=[
            item.execution_id for item in others if item.outcome == BulkItemOutcome.SUCCEEDED
        ],
        created_at=row.created_at,
        finished_at=row.finished_at,
    )
