"""What an operator does to a rollout: pause, resume, cancel, retry the failed children.

A rollout is named by its parent execution (the execution of the rollout step; its latest
rollout when a transition has several). Pause, resume and cancel mark the rollout row and
wake the waiting parent in one transaction, audited on the parent; the next child's start
(`store._TAKE_NEXT`) reads the marks under the same row lock, so no child starts after a
pause or a cancel committed. A cancel then cancels the running children one by one, each
under the write rule (`queue.reconciliation.cancel`): a child with a write done or in
doubt parks for a person, one whose step is in flight stops when its call returns. "Retry the
failed" starts a new run of the parent's flow version and transition, as a new request
with the same data, whose rollout step runs over just the failed items: the new step's
rollout is written with the run, keyed by its external key, so the step finds it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, insert, text

from orquestador.db.schema import JSONB_VALUE, audit_event
from orquestador.domain.concurrency import KeyMissing
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.statuses import UNFINISHED, RolloutChildStatus
from orquestador.errors import Refusal
from orquestador.queue.acceptance import queue_execution
from orquestador.queue.reconciliation import NotCancellable, cancel
from orquestador.queue.waits import wake_waiting
from orquestador.rollouts.store import wait_key

# The audit kinds, on the parent execution.
ROLLOUT_PAUSED = "ROLLOUT_PAUSED"
ROLLOUT_RESUMED = "ROLLOUT_RESUMED"
ROLLOUT_CANCELLED = "ROLLOUT_CANCELLED"
ROLLOUT_RETRIED = "ROLLOUT_RETRIED"


class RolloutRefused(Refusal):
    """The rollout cannot do that now."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


ROLLOUT_NOT_FOUND = "NOT_FOUND"
ROLLOUT_ENDED = "ROLLOUT_ENDED"
ROLLOUT_NOTHING_TO_RETRY = "ROLLOUT_NOTHING_TO_RETRY"
ROLLOUT_RETRY_REFUSED = "ROLLOUT_RETRY_REFUSED"

# The parent execution's latest rollout, locked, with the parent's status.
_LOCK_LATEST = text(
    """
    SELECT r.*, e.status AS parent_status
    FROM rollout r JOIN execution e ON e.id = r.execution_id
    WHERE r.execution_id = :execution_id AND r.org_id = :org
    ORDER BY r.created_at DESC, r.id
    LIMIT 1
    FOR UPDATE OF r
    """
)

_MARK = {
    "pause": text(
        """UPDATE rollout SET paused_at = clock_timestamp(), paused_by = :actor,
                  changed_at = clock_timestamp()
           WHERE id = :id AND paused_at IS NULL"""
    ),
    "resume": text(
        """UPDATE rollout SET paused_at = NULL, paused_by = NULL, changed_at = clock_timestamp()
           WHERE id = :id AND paused_at IS NOT NULL"""
    ),
    "cancel": text(
        """UPDATE rollout SET cancelled_at = clock_timestamp(), cancelled_by = :actor,
                  changed_at = clock_timestamp()
           WHERE id = :id AND cancelled_at IS NULL"""
    ),
}
_AUDIT_KIND = {"pause": ROLLOUT_PAUSED, "resume": ROLLOUT_RESUMED, "cancel": ROLLOUT_CANCELLED}

_RUNNING_CHILDREN = text(
    f"""
    SELECT execution_id FROM rollout_child
    WHERE rollout_id = :id AND status = '{RolloutChildStatus.RUNNING}' AND execution_id IS NOT NULL
    ORDER BY item_index
    """
)

_FAILED_ITEMS = text(
    "SELECT item FROM rollout_child"
    f" WHERE rollout_id = :id AND status = '{RolloutChildStatus.FAILED}' ORDER BY item_index"
)

_PARENT = text(
    """
    SELECT e.request_id, e.flow_id, e.transition_id, e.priority, r.data, r.machine_id,
           f.definition, f.data_schema
    FROM execution e JOIN request r ON r.id = e.request_id JOIN flow f ON f.id = e.flow_id
    WHERE e.id = :execution_id
    """
)

_RETRY_ROLLOUT = text(
    """
    INSERT INTO rollout (org_id, request_id, execution_id, action_id, external_key, flow_id,
                         transition_id, items, data, total, batch, max_failures,
                         pause_between_seconds, actor_snapshot, priority, retry_of)
    SELECT org_id, :request_id, :execution_id, action_id, :external_key, flow_id,
           transition_id, :items, data, :total, least(batch, greatest(:total, 1)),
           max_failures, pause_between_seconds, :actor_snapshot, priority, id
    FROM rollout WHERE id = :retry_of
    """
).bindparams(bindparam("items", type_=JSONB_VALUE), bindparam("actor_snapshot", type_=JSONB_VALUE))


@dataclass(frozen=True)
class RolloutCancelled:
    """What a cancel did: the rollout marked, and each running child's fate."""

    rollout_id: uuid.UUID
    children: dict[str, str] = field(default_factory=dict)  # execution id -> status or why not

    def as_json(self) -> dict[str, Any]:
        return {"rolloutId": str(self.rollout_id), "children": dict(self.children)}


@dataclass(frozen=True)
class RolloutRetried:
    rollout_id: uuid.UUID
    request_id: uuid.UUID
    execution_id: uuid.UUID
    items: int

    def as_json(self) -> dict[str, Any]:
        return {
            "retryOf": str(self.rollout_id),
            "requestId": str(self.request_id),
            "executionId": str(self.execution_id),
            "items": self.items,
        }


def _locked(conn: Connection, execution_id: uuid.UUID, org: str) -> Row:
    row = conn.execute(_LOCK_LATEST, {"execution_id": execution_id, "org": org}).one_or_none()
    if row is None:
        raise RolloutRefused(ROLLOUT_NOT_FOUND, "The execution has no rollout.")
    return row


def _require_live(row: Row, what: str) -> None:
    if row.parent_status not in UNFINISHED:
        raise RolloutRefused(
            ROLLOUT_ENDED,
            f"The rollout's execution is {row.parent_status}: there is nothing left to {what}.",
        )


def _audit(conn: Connection, row: Row, kind: str, actor: str, detail: dict[str, Any]) -> None:
    conn.execute(
        insert(audit_event).values(
            org_id=row.org_id,
            kind=kind,
            request_id=row.request_id,
            execution_id=row.execution_id,
            actor=actor,
            detail={"rolloutId": str(row.id), "actionId": row.action_id, **detail},
        )
    )


def mark(
    conn: Connection, *, what: str, execution_id: uuid.UUID, org: str, actor: str, reason: str
) -> uuid.UUID:
    """Pause, resume or cancel (`what`) the execution's rollout; its id. Repeating a
    mark that is already there changes nothing and audits nothing."""
    with conn.begin():
        row = _locked(conn, execution_id, org)
        _require_live(row, what)
        if what == "resume" and row.cancelled_at is not None:
            raise RolloutRefused(ROLLOUT_ENDED, "The rollout was cancelled: it cannot resume.")
        changed = conn.execute(_MARK[what], {"id": row.id, "actor": actor}).rowcount
        if changed:
            _audit(conn, row, _AUDIT_KIND[what], actor, {"reason": reason})
            # The parent waiting on the rollout looks again at once: a resume starts the
            # next children, a cancel ends the step once nothing runs.
            wake_waiting(conn, wait_key(row.id))
    return row.id


def cancel_rollout(
    engine: Engine, *, execution_id: uuid.UUID, org: str, actor: str, reason: str
) -> RolloutCancelled:
    """No new child, then each running child cancelled under the write rule."""
    with engine.connect() as conn:
        rollout_id = mark(
            conn, what="cancel", execution_id=execution_id, org=org, actor=actor, reason=reason
        )
        running = conn.execute(_RUNNING_CHILDREN, {"id": rollout_id}).scalars().all()
        conn.rollback()
        fates: dict[str, str] = {}
        for child in running:
            try:
                ended = cancel(
                    conn, child, org_id=org, actor=actor, reason=f"rollout cancelled: {reason}"
                )
                # A step in flight is never cut mid-call: its worker applies the cancel
                # when the call returns.
                fates[str(child)] = (
                    "cancel requested: stops when its step's call returns"
                    if ended.requested
                    else ended.status
                )
            except NotCancellable as left:
                fates[str(child)] = f"left to finish: {left.message}"
    return RolloutCancelled(rollout_id, fates)


def retry_failed(
    conn: Connection,
    *,
    execution_id: uuid.UUID,
    org: str,
    actor: str,
    actor_snapshot: dict[str, Any],
    max_attempts: int,
) -> RolloutRetried:
    """A new run of the parent's flow and transition whose rollout runs over the failed
    items only; refused while the rollout still moves or when nothing failed."""
    with conn.begin():
        row = _locked(conn, execution_id, org)
        if row.parent_status in UNFINISHED or row.running:
            raise RolloutRefused(
                ROLLOUT_ENDED,
                "The rollout is still running: retry its failed children once it has ended.",
            )
        items = list(conn.execute(_FAILED_ITEMS, {"id": row.id}).scalars())
        if not items:
            raise RolloutRefused(ROLLOUT_NOTHING_TO_RETRY, "No child of the rollout failed.")
        parent = conn.execute(_PARENT, {"execution_id": execution_id}).one()
        definition = FlowDefinition.from_json(parent.definition)
        transition = definition.transitions.get(parent.transition_id)
        if transition is None or not transition.leaves(definition.initial_state):
            raise RolloutRefused(
                ROLLOUT_RETRY_REFUSED,
                f"The rollout's transition {parent.transition_id!r} does not start from the "
                f"flow's initial state, so a new request cannot run it.",
            )
        created = _new_request(conn, org, actor, parent, definition)
        try:
            new_execution = queue_execution(
                conn,
                request_row=created,
                definition=definition,
                transition_id=parent.transition_id,
                actor=actor,
                actor_snapshot=actor_snapshot,
                max_attempts=max_attempts,
                priority=parent.priority,
                started_by={"retryOfRollout": str(row.id), "by": actor},
            )
        except KeyMissing as missing:
            raise RolloutRefused(
                ROLLOUT_RETRY_REFUSED,
                f"The request data gives no concurrency key at {missing.problem.path}.",
            ) from None
        conn.execute(
            _RETRY_ROLLOUT,
            {
                "request_id": created.id,
                "execution_id": new_execution,
                "external_key": f"{new_execution}:{row.action_id}",
                "items": items,
                "total": len(items),
                "actor_snapshot": actor_snapshot,
                "retry_of": row.id,
            },
        )
        _audit(
            conn,
            row,
            ROLLOUT_RETRIED,
            actor,
            {"items": len(items), "executionId": str(new_execution)},
        )
    return RolloutRetried(row.id, created.id, new_execution, len(items))


def _new_request(
    conn: Connection, org: str, actor: str, parent: Row, definition: FlowDefinition
) -> Row:
    from orquestador.queue.acceptance import insert_request

    flow_row = _FlowRow(parent.flow_id, parent.definition)
    return insert_request(
        conn,
        org=org,
        owner=actor,
        flow_row=flow_row,  # type: ignore[arg-type]
        data=parent.data,
        machine_id=parent.machine_id,
    )


@dataclass(frozen=True)
class _FlowRow:
    """What insert_request reads of a flow row."""

    id: uuid.UUID
    definition: Any
