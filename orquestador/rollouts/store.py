"""A rollout's rows: written once by its step, then one committed transaction per child.

Exactly once: an item's child is written in the transaction that takes the item
(`_TAKE_NEXT` moves `next_index` past it), and `rollout_child`'s primary key (rollout,
item index) refuses a second child for it whatever happens; a worker killed between two
children leaves the first committed and the second not begun, and the next round goes
on from `next_index`.

The failure budget and the batch: `_TAKE_NEXT` is a conditional UPDATE of the rollout row,
so it takes the row's lock and re-checks its predicate on the row as committed; every
child's end counts itself in the same row under the same lock (the trigger of migration
0031). So no child starts once the budget is spent, and never more than `batch` run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, text

from orquestador.automation.schedules import FlowNotFound, resolve_flow
from orquestador.db.schema import JSONB_VALUE
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.errors import DataValidationError
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.limits import MAX_DATA_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.domain.rollouts import ItemProblem, RolloutCounts, child_data, machine_of
from orquestador.domain.statuses import ExecutionStatus, RolloutChildStatus
from orquestador.queue.acceptance import insert_request, queue_execution

log = logging.getLogger(__name__)

# Test seam: called inside each child's start transaction, once the child is written and
# before COMMIT, with the item's index (a crash test kills the worker there).
before_child_commit: Callable[[int], None] | None = None

# What a parent waiting on a rollout waits for: a child's end, a pause, a resume, a cancel.
WAIT_PREFIX = "rollout:"


def wait_key(rollout_id: uuid.UUID) -> str:
    return f"{WAIT_PREFIX}{rollout_id}"


@dataclass(frozen=True)
class RolloutDraft:
    """What a rollout step's first round writes: its items frozen, its limits as numbers."""

    org_id: str
    request_id: uuid.UUID
    execution_id: uuid.UUID
    action_id: str
    external_key: str
    flow_id: uuid.UUID
    transition_id: str
    items: list[Any]
    data: dict[str, Any]
    batch: int
    max_failures: int
    pause_between_seconds: float
    retry_of: uuid.UUID | None = None


# The first round writes the rollout; every later round (a retry, another holder) finds
# it by the step's external key and runs over what was frozen then. Whom the children act
# for and their priority are the parent's.
_OPEN = text(
    """
    INSERT INTO rollout (org_id, request_id, execution_id, action_id, external_key, flow_id,
                         transition_id, items, data, total, batch, max_failures,
                         pause_between_seconds, actor_snapshot, priority, retry_of)
    SELECT :org_id, :request_id, :execution_id, :action_id, :external_key, :flow_id,
           :transition_id, :items, :data, jsonb_array_length(:items), :batch, :max_failures,
           :pause_between_seconds, e.actor_snapshot, e.priority, :retry_of
    FROM execution e WHERE e.id = :execution_id
    ON CONFLICT (external_key) DO NOTHING
    """
).bindparams(bindparam("items", type_=JSONB_VALUE), bindparam("data", type_=JSONB_VALUE))

_FIND = text("SELECT * FROM rollout WHERE external_key = :external_key")

# Take the next item, if the rollout may start a child now. One conditional UPDATE: it
# locks the rollout row, and a child's end (which counts itself in this row) either
# committed before, and is seen here, or waits for this transaction.
_TAKE_NEXT = text(
    f"""
    UPDATE rollout r
    SET next_index = r.next_index + 1,
        running = r.running + 1,
        next_start_at = clock_timestamp() + make_interval(secs => r.pause_between_seconds)
    WHERE r.id = :rollout_id
      -- The failure budget: once failures exceed maxFailures, no child starts.
      AND r.failed <= r.max_failures
      -- The batch: at most this many children running at once.
      AND r.running < r.batch
      AND r.next_index < r.total
      AND r.paused_at IS NULL AND r.cancelled_at IS NULL
      AND (r.next_start_at IS NULL OR r.next_start_at <= clock_timestamp())
      -- Only while the parent's step runs (a parent cancelled or failed starts nothing).
      AND EXISTS (SELECT 1 FROM execution p
                  WHERE p.id = r.execution_id AND p.status = '{ExecutionStatus.RUNNING}')
    RETURNING r.next_index - 1 AS item_index, r.items -> (r.next_index - 1) AS item
    """
)

_CHILD = text(
    f"""
    INSERT INTO rollout_child (rollout_id, item_index, parent_execution_id, item, request_id,
                               execution_id, status, refusal, ended_at)
    VALUES (:rollout_id, :item_index, :parent_execution_id, :item, :request_id, :execution_id,
            :status, :refusal,
            CASE WHEN :status = '{RolloutChildStatus.RUNNING}' THEN NULL ELSE clock_timestamp() END)
    """
).bindparams(bindparam("item", type_=JSONB_VALUE))

# A refused item never ran: it counts as a failure at once, in the transaction that took it.
_REFUSED = text(
    """
    UPDATE rollout SET running = running - 1, failed = failed + 1, changed_at = clock_timestamp()
    WHERE id = :rollout_id
    """
)

_READ = text(
    """
    SELECT r.id, r.total, r.next_index, r.running, r.succeeded, r.failed, r.cancelled,
           r.max_failures, r.batch, r.paused_at, r.cancelled_at, r.cancelled_by, r.next_start_at,
           clock_timestamp() AS read_at
    FROM rollout r WHERE r.id = :rollout_id
    """
)

_CHILDREN = text(
    """
    SELECT item_index, item, request_id, execution_id, status, refusal
    FROM rollout_child WHERE rollout_id = :rollout_id ORDER BY item_index
    """
)


def open_rollout(conn: Connection, draft: RolloutDraft) -> Row:
    """The step's rollout: written now if this is its first round, else as first written."""
    conn.execute(
        _OPEN,
        {
            "org_id": draft.org_id,
            "request_id": draft.request_id,
            "execution_id": draft.execution_id,
            "action_id": draft.action_id,
            "external_key": draft.external_key,
            "flow_id": draft.flow_id,
            "transition_id": draft.transition_id,
            "items": draft.items,
            "data": draft.data,
            "batch": draft.batch,
            "max_failures": draft.max_failures,
            "pause_between_seconds": draft.pause_between_seconds,
            "retry_of": draft.retry_of,
        },
    )
    return conn.execute(_FIND, {"external_key": draft.external_key}).one()


def find_rollout(conn: Connection, external_key: str) -> Row | None:
    return conn.execute(_FIND, {"external_key": external_key}).one_or_none()


def pinned_flow(conn: Connection, rollout: Row) -> tuple[Row, FlowDefinition]:
    """The child flow's version the rollout pinned when it was written."""
    row, _ = resolve_flow(conn, org=rollout.org_id, named=str(rollout.flow_id))
    return row, FlowDefinition.from_json(row.definition)


def start_due_children(
    engine: Engine,
    rollout: Row,
    *,
    max_attempts: int,
    should_stop: Callable[[], bool],
    has_room: Callable[[Connection], bool] | None = None,
) -> int:
    """Start children, one committed transaction each, while the rollout may; how many.

    Stops when `_TAKE_NEXT` takes no item (the batch is full, the budget spent, the
    rollout paused, cancelled or done, the pause between starts not over), when
    `has_room` says the organization may start no more executions (its quota
    openExecutions), or
    when the call must wrap up (`should_stop`): the next round goes on from `next_index`.
    """
    with engine.connect() as conn:
        try:
            flow_row, definition = pinned_flow(conn, rollout)
        except FlowNotFound:
            flow_row, definition = None, None
        conn.rollback()
    started = 0
    while not should_stop():
        with engine.begin() as conn:
            if has_room is not None and not has_room(conn):
                log.info(
                    "rollout waits: the organization's quota openExecutions is used up",
                    extra={"execution_id": str(rollout.execution_id)},
                )
                return started
            taken = conn.execute(_TAKE_NEXT, {"rollout_id": rollout.id}).first()
            if taken is None:
                return started
            _start_child(conn, rollout, taken, flow_row, definition, max_attempts)
            if before_child_commit is not None:
                before_child_commit(taken.item_index)
        started += 1
    return started


def _start_child(
    conn: Connection,
    rollout: Row,
    taken: Row,
    flow_row: Row | None,
    definition: FlowDefinition | None,
    max_attempts: int,
) -> None:
    item, index = taken.item, taken.item_index
    child = {
        "rollout_id": rollout.id,
        "item_index": index,
        "parent_execution_id": rollout.execution_id,
        "item": item,
        "request_id": None,
        "execution_id": None,
        "status": RolloutChildStatus.RUNNING.value,
        "refusal": None,
    }
    refusal = None
    data: Any = None
    if flow_row is None or definition is None:
        refusal = "the rollout's flow version no longer exists"
    else:
        try:
            data = child_data(rollout.data, item)
            validate_request_data(data, flow_row.data_schema, max_bytes=MAX_DATA_BYTES)
            concurrency = definition.transitions[rollout.transition_id].concurrency
            if concurrency is not None:
                key_value(concurrency, data)
        except ItemProblem as problem:
            refusal = str(problem)
        except DataValidationError as invalid:
            refusal = "the flow's data schema refuses the item's data: " + "; ".join(
                f"{p.path or '/'} {p.message}" for p in invalid.problems[:3]
            )
        except KeyMissing as missing:
            refusal = f"the item's data gives no concurrency key at {missing.problem.path}"
    if refusal is not None:
        conn.execute(
            _CHILD, {**child, "status": RolloutChildStatus.FAILED.value, "refusal": refusal}
        )
        conn.execute(_REFUSED, {"rollout_id": rollout.id})
        log.info(
            "rollout item refused: %s",
            refusal,
            extra={"execution_id": str(rollout.execution_id), "item_index": index},
        )
        return
    assert flow_row is not None and definition is not None
    snapshot = rollout.actor_snapshot if isinstance(rollout.actor_snapshot, dict) else {}
    actor = str(snapshot.get("sub") or "worker")
    created = insert_request(
        conn,
        org=rollout.org_id,
        owner=actor,
        flow_row=flow_row,
        data=data,
        machine_id=machine_of(item),
    )
    execution_id = queue_execution(
        conn,
        request_row=created,
        definition=definition,
        transition_id=rollout.transition_id,
        actor=actor,
        actor_snapshot=snapshot,
        max_attempts=max_attempts,
        priority=rollout.priority,
        started_by={"rollout": str(rollout.execution_id), "item": index},
        parent_execution_id=rollout.execution_id,
    )
    conn.execute(_CHILD, {**child, "request_id": created.id, "execution_id": execution_id})


def read_counts(conn: Connection, rollout_id: uuid.UUID) -> tuple[RolloutCounts, Row]:
    row = conn.execute(_READ, {"rollout_id": rollout_id}).one()
    counts = RolloutCounts(
        total=row.total,
        started=row.next_index,
        running=row.running,
        succeeded=row.succeeded,
        failed=row.failed,
        cancelled=row.cancelled,
        max_failures=row.max_failures,
        stopped=row.cancelled_at is not None,
    )
    return counts, row


def children_of(conn: Connection, rollout: Row, counts: RolloutCounts) -> list[dict[str, Any]]:
    """Every item with what became of it, in order; one never started is `skipped`."""
    started = {row.item_index: row for row in conn.execute(_CHILDREN, {"rollout_id": rollout.id})}
    children: list[dict[str, Any]] = []
    for index, item in enumerate(rollout.items):
        row = started.get(index)
        if row is None:
            children.append({"item": item, "status": RolloutChildStatus.SKIPPED.value})
            continue
        child: dict[str, Any] = {
            "item": item,
            "requestId": None if row.request_id is None else str(row.request_id),
            "executionId": None if row.execution_id is None else str(row.execution_id),
            "status": row.status,
        }
        if row.refusal is not None:
            child["refusal"] = row.refusal
        children.append(child)
    return children
