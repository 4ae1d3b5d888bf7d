"""The approval row's statements: opened by the step, decided by a person, closed at the deadline.

A decision and the deadline are both conditional updates of the open row, each judged by
the database clock when it holds the row lock: whichever comes second finds the row
closed, so exactly one of them wins. The step's execution waits WAITING on the key
`approval:<id>`; a decision wakes it in the decision's own transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from sqlalchemy import Connection, Row, func, select, text
from sqlalchemy.dialects.postgresql import insert

from orquestador.db.schema import approval, audit_event, request
from orquestador.db.sql_literals import quoted
from orquestador.domain.statuses import UNFINISHED, ApprovalStatus, ExecutionStatus
from orquestador.queue.waits import wake_waiting

WAIT_PREFIX = "approval:"
DECISIONS = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)

AUDIT_DECIDED = "APPROVAL_DECIDED"
AUDIT_EXPIRED = "APPROVAL_EXPIRED"


def wait_key(approval_id: uuid.UUID) -> str:
    return f"{WAIT_PREFIX}{approval_id}"


@dataclass(frozen=True)
class ApprovalDraft:
    """What the step asks, of whom, and until when."""

    org_id: str
    request_id: uuid.UUID
    execution_id: uuid.UUID
    action_id: str
    external_key: str
    title: str
    body: str
    subjects: list[str]
    scope: str | None
    deadline_seconds: int
    actor: str | None


# The row as read, with the database's clock at the read: deadlines are judged by it.
_READ = (*approval.c, func.clock_timestamp().label("read_at"))


def open_approval(conn: Connection, draft: ApprovalDraft) -> tuple[Row, bool]:
    """The step's approval, written by its first round; (row, whether written now).

    Keyed by the step's external key: a later round, a retry or a new holder finds the
    one the first round wrote, with its deadline counted from then.
    """
    owner = conn.scalar(
        select(request.c.owner_id).where(
            request.c.id == draft.request_id, request.c.org_id == draft.org_id
        )
    )
    requesters = sorted({who for who in (draft.actor, owner) if who})
    written = conn.execute(
        insert(approval)
        .values(
            org_id=draft.org_id,
            request_id=draft.request_id,
            execution_id=draft.execution_id,
            action_id=draft.action_id,
            external_key=draft.external_key,
            title=draft.title,
            body=draft.body,
            approver_subjects=draft.subjects,
            approver_scope=draft.scope,
            requesters=requesters,
            deadline_at=func.clock_timestamp()
            + func.make_interval(0, 0, 0, 0, 0, 0, draft.deadline_seconds),
        )
        .on_conflict_do_nothing(index_elements=["external_key"])
        .returning(approval.c.id)
    ).first()
    row = conn.execute(
        select(*_READ).where(
            approval.c.external_key == draft.external_key, approval.c.org_id == draft.org_id
        )
    ).one()
    return row, written is not None


_EXPIRE = text(
    f"""
    UPDATE approval
    SET status = '{ApprovalStatus.EXPIRED}', decided_at = clock_timestamp()
    WHERE id = :id AND status = '{ApprovalStatus.OPEN}' AND deadline_at <= clock_timestamp()
    RETURNING id
    """
)


def close_at_deadline(conn: Connection, approval_id: uuid.UUID, actor: str) -> Row:
    """Close the approval if its deadline has passed and nobody decided; the row after.

    Waits for a decision holding the row; the row then says who won.
    """
    expired = conn.execute(_EXPIRE, {"id": approval_id}).first()
    row = conn.execute(select(*_READ).where(approval.c.id == approval_id)).one()
    if expired is not None:
        conn.execute(
            insert(audit_event).values(
                org_id=row.org_id,
                request_id=row.request_id,
                execution_id=row.execution_id,
                kind=AUDIT_EXPIRED,
                actor=actor,
                detail={"approvalId": str(row.id), "deadlineAt": row.deadline_at.isoformat()},
            )
        )
    return row


# Open, before its deadline, and its execution live (not ended, not parked for a person):
# judged as the row lock is held, so a deadline closing it first leaves nothing to decide.
_DECIDE = text(
    f"""
    UPDATE approval
    SET status = :decision, decided_by = :sub, decided_at = clock_timestamp(),
        comment = :comment
    WHERE id = :id AND status = '{ApprovalStatus.OPEN}'
      AND deadline_at > clock_timestamp()
      AND EXISTS (SELECT FROM execution e
                  WHERE e.id = approval.execution_id AND e.status IN ({quoted(UNFINISHED)})
                    -- A cancel asked while the wait was checked again: it is ending.
                    AND e.cancel_requested_at IS NULL)
    RETURNING id
    """
)


# The request, then the execution: the order a cancel and a reconciliation lock them in
# (queue/reconciliation.py). Held until the decision commits, so a cancel racing it
# either committed first (the decision then reads the execution ended) or waits behind it.
_LOCK_REQUEST = text("SELECT 1 FROM request WHERE id = :request_id FOR UPDATE")
_LOCK_EXECUTION = text("SELECT status FROM execution WHERE id = :execution_id FOR UPDATE")

_EXECUTION_ENDED = {
    ExecutionStatus.CANCELLED: "its execution was cancelled",
    ExecutionStatus.FAILED: "its execution failed",
    ExecutionStatus.SUCCEEDED: "its execution has already ended",
    ExecutionStatus.RECONCILIATION_REQUIRED: "its execution waits for an operator's decision",
}


def record_decision(
    conn: Connection, row: Row, sub: str, decision: str, comment: str
) -> Row | None:
    """Decide the open approval `row` (read by the caller's access, its row locked); None if
    it closed first (`why_closed` says how).

    The request and the execution are locked first, in the order every cancel and
    reconciliation takes them, so the execution's status is read as committed.
    Audited with who, when and the comment, in the same transaction as the wake.
    """
    conn.execute(_LOCK_REQUEST, {"request_id": row.request_id})
    conn.execute(_LOCK_EXECUTION, {"execution_id": row.execution_id})
    decided = conn.execute(
        _DECIDE, {"id": row.id, "decision": decision, "sub": sub, "comment": comment}
    ).first()
    if decided is None:
        return None
    after = conn.execute(select(*_READ).where(approval.c.id == row.id)).one()
    conn.execute(
        insert(audit_event).values(
            org_id=after.org_id,
            request_id=after.request_id,
            execution_id=after.execution_id,
            kind=AUDIT_DECIDED,
            actor=sub,
            detail={"approvalId": str(after.id), "decision": decision, "comment": comment},
        )
    )
    wake_waiting(conn, wait_key(after.id))
    return after


def why_closed(conn: Connection, approval_id: uuid.UUID) -> str:
    """Why the approval cannot be decided any more, in words for the person who tried."""
    found = conn.execute(
        text(
            """
            SELECT a.status, a.decided_by, a.deadline_at, a.deadline_at <= clock_timestamp()
                   AS passed, e.status AS execution_status, e.cancel_requested_by
            FROM approval a JOIN execution e ON e.id = a.execution_id
            WHERE a.id = :id
            """
        ),
        {"id": approval_id},
    ).one()
    if found.status in DECISIONS:
        return f"The approval was already {found.status} by {found.decided_by}."
    if found.status == ApprovalStatus.EXPIRED or found.passed:
        deadline = found.deadline_at.astimezone(UTC)
        return (
            f"The approval's deadline passed ({deadline:%Y-%m-%d %H:%M} UTC):"
            " nobody can decide it any more."
        )
    if found.cancel_requested_by is not None and found.execution_status in UNFINISHED:
        return (
            "The approval can no longer be decided: a cancel of its execution was requested"
            f" by {found.cancel_requested_by}."
        )
    ended = _EXECUTION_ENDED.get(found.execution_status, "its execution has ended")
    return f"The approval can no longer be decided: {ended}."


def decision_output(row: Row) -> dict[str, Any]:
    """The step's output once a person decided."""
    return {
        "approvalId": str(row.id),
        "decision": row.status,
        "by": row.decided_by,
        "at": row.decided_at.isoformat(),
        "comment": row.comment or "",
    }
