"""Reading and deciding approvals as a caller: organization and approver rights in the SQL.

A caller sees an approval of its own organization that names its `sub` among the
subjects, or a scope it holds. Any other approval, another organization's included, is
indistinguishable from a missing one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, func, literal, or_, select, tuple_

from orquestador.db.schema import approval, execution, flow, request
from orquestador.domain.statuses import UNFINISHED, ApprovalListing, ApprovalStatus

# The execution's status beside the approval: an approval whose execution is not live
# (it ended: a cancel, a lapsed wait; or it is parked for a person) cannot be decided,
# and lists with the closed ones. And what the approval is about, for the person who
# decides: the flow and transition that ask, the machine, and who asked for it.
_COLUMNS = (
    *approval.c,
    execution.c.status.label("execution_status"),
    func.clock_timestamp().label("read_at"),
    flow.c.key.label("flow_key"),
    flow.c.version.label("flow_version"),
    execution.c.transition_id,
    func.coalesce(request.c.machine_id, request.c.data.op("->>")("machineId")).label("machine_id"),
    execution.c.actor_snapshot.op("->>")("sub").label("requested_by"),
)


@dataclass(frozen=True)
class ApprovalPage:
    limit: int
    status: str = ApprovalListing.OPEN
    # (created_at, id) of the last approval of the previous page.
    after: tuple[datetime, uuid.UUID] | None = None


def is_open(row: Row) -> bool:
    """Whether a person may still decide: open, before its deadline, its execution live."""
    return (
        row.status == ApprovalStatus.OPEN
        and row.read_at < row.deadline_at
        and row.execution_status in UNFINISHED
    )


def approval_view(row: Row) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "executionId": str(row.execution_id),
        "requestId": str(row.request_id),
        "actionId": row.action_id,
        "title": row.title,
        "body": row.body,
        "approvers": {"subjects": list(row.approver_subjects), "scope": row.approver_scope},
        "status": row.status,
        "open": is_open(row),
        "deadlineAt": row.deadline_at.isoformat(),
        "decidedBy": row.decided_by,
        "decidedAt": row.decided_at.isoformat() if row.decided_at else None,
        "comment": row.comment,
        "createdAt": row.created_at.isoformat(),
        # What it approves: which flow's transition, on which machine, asked by whom.
        "flowKey": row.flow_key,
        "flowVersion": row.flow_version,
        "transitionId": row.transition_id,
        "machineId": row.machine_id,
        "requestedBy": row.requested_by,
    }


class ApprovalAccess:
    """What one caller may read and decide."""

    def __init__(self, org: str, sub: str, scopes: Iterable[str]) -> None:
        self._org = org
        self._sub = sub
        self._scopes = sorted(scopes)

    def _sees(self) -> ColumnElement[bool]:
        return (approval.c.org_id == self._org) & or_(
            approval.c.approver_subjects.contains([self._sub]),
            approval.c.approver_scope == func.any(literal(self._scopes)),
        )

    def _select(self) -> Any:
        return (
            select(*_COLUMNS)
            .select_from(
                approval.join(execution, execution.c.id == approval.c.execution_id)
                .join(flow, flow.c.id == execution.c.flow_id)
                .join(request, request.c.id == approval.c.request_id)
            )
            .where(self._sees())
        )

    def find(self, conn: Connection, approval_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        query = self._select().where(approval.c.id == approval_id)
        if lock:
            # The decision's lock: a deadline closing the approval waits for it, or it
            # waits for the deadline, and then reads what that left.
            query = query.with_for_update(of=approval)
        return conn.execute(query).one_or_none()

    def list(self, conn: Connection, page: ApprovalPage) -> list[Row]:
        query = self._select()
        if page.status == ApprovalListing.OPEN:
            query = query.where(
                approval.c.status == ApprovalStatus.OPEN,
                approval.c.deadline_at > func.clock_timestamp(),
                execution.c.status.in_(sorted(UNFINISHED)),
            )
        elif page.status == ApprovalListing.CLOSED:
            query = query.where(
                or_(
                    approval.c.status != ApprovalStatus.OPEN,
                    approval.c.deadline_at <= func.clock_timestamp(),
                    execution.c.status.notin_(sorted(UNFINISHED)),
                )
            )
        if page.after is not None:
            query = query.where(tuple_(approval.c.created_at, approval.c.id) > tuple_(*page.after))
        query = query.order_by(approval.c.created_at, approval.c.id).limit(page.limit + 1)
        return list(conn.execute(query))
