"""What the API, the pages and the command line show of a rollout: its counts, its budget,
whether it is paused or cancelled, and its children."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, Row, text

from orquestador.domain.rollouts import RolloutCounts
from orquestador.domain.statuses import ROLLOUT_ITEM_WAITING, UNFINISHED, RolloutChildStatus

_LATEST = text(
    """
    SELECT r.*, e.status AS parent_status
    FROM rollout r JOIN execution e ON e.id = r.execution_id
    WHERE r.execution_id = :execution_id AND r.org_id = :org
    ORDER BY r.created_at DESC, r.id
    LIMIT 1
    """
)

_CHILDREN = text(
    """
    SELECT c.item_index, c.item, c.request_id, c.execution_id, c.status, c.refusal,
           e.status AS execution_status
    FROM rollout_child c LEFT JOIN execution e ON e.id = c.execution_id
    WHERE c.rollout_id = :rollout_id
    ORDER BY c.item_index
    """
)


def latest_rollout(conn: Connection, *, org: str, execution_id: uuid.UUID) -> Row | None:
    """The execution's latest rollout with its parent's status, or None."""
    return conn.execute(_LATEST, {"execution_id": execution_id, "org": org}).one_or_none()


def counts_of(row: Row) -> RolloutCounts:
    return RolloutCounts(
        total=row.total,
        started=row.next_index,
        running=row.running,
        succeeded=row.succeeded,
        failed=row.failed,
        cancelled=row.cancelled,
        max_failures=row.max_failures,
        stopped=row.cancelled_at is not None,
    )


def rollout_view(row: Row) -> dict[str, Any]:
    """The rollout as the API answers it."""
    counts = counts_of(row)
    return {
        "rolloutId": str(row.id),
        "executionId": str(row.execution_id),
        "actionId": row.action_id,
        "flowId": str(row.flow_id),
        "transitionId": row.transition_id,
        **{k: v for k, v in counts.as_json().items() if k != "maxFailures"},
        "started": row.next_index,
        "batch": row.batch,
        "maxFailures": row.max_failures,
        "budgetSpent": counts.budget_spent,
        "paused": row.paused_at is not None,
        "pausedBy": row.paused_by,
        "cancelRequested": row.cancelled_at is not None,
        "cancelledBy": row.cancelled_by,
        "live": row.parent_status in UNFINISHED,
        "retryOf": None if row.retry_of is None else str(row.retry_of),
    }


def rollout_children(conn: Connection, row: Row) -> list[dict[str, Any]]:
    """Every item in order with its child, if it has one."""
    started = {c.item_index: c for c in conn.execute(_CHILDREN, {"rollout_id": row.id})}
    counts = counts_of(row)
    children: list[dict[str, Any]] = []
    for index, item in enumerate(row.items):
        child = started.get(index)
        if child is None:
            status = RolloutChildStatus.SKIPPED if counts.skipped else ROLLOUT_ITEM_WAITING
            children.append({"index": index, "item": item, "status": status})
            continue
        children.append(
            {
                "index": index,
                "item": item,
                "status": child.status,
                "requestId": None if child.request_id is None else str(child.request_id),
                "executionId": None if child.execution_id is None else str(child.execution_id),
                "executionStatus": child.execution_status,
                **({"refusal": child.refusal} if child.refusal else {}),
            }
        )
    return children
