"""Reading and dismissing an organization's panel notices, with the organization in the SQL.

The API's notices routes reach `panel_notice` only through `NoticeAccess`: every
statement carries the caller's organization, so another organization's notice is
indistinguishable from a missing one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, String, case, cast, func, select, tuple_, update

from orquestador.db.schema import audit_event, panel_notice
from orquestador.notices.vocabulary import AUDIT_NOTICE_EMAIL_SETTLED, EmailOutcome

# A queued e-mail's notice says what became of it once the mailer settled it: the latest
# NOTICE_EMAIL_SETTLED row about the notice, found through the execution's index.
_SETTLED = (
    select(audit_event.c.detail["email"].astext)
    .where(
        audit_event.c.execution_id == panel_notice.c.execution_id,
        audit_event.c.org_id == panel_notice.c.org_id,
        audit_event.c.kind == AUDIT_NOTICE_EMAIL_SETTLED,
        audit_event.c.detail["noticeId"].astext == cast(panel_notice.c.id, String),
    )
    .order_by(audit_event.c.id.desc())
    .limit(1)
    .scalar_subquery()
)
_EMAIL = case(
    (
        panel_notice.c.email == EmailOutcome.QUEUED.value,
        func.coalesce(_SETTLED, panel_notice.c.email),
    ),
    else_=panel_notice.c.email,
).label("email")

_COLUMNS = (
    panel_notice.c.id,
    panel_notice.c.category,
    panel_notice.c.severity,
    panel_notice.c.title,
    panel_notice.c.body,
    _EMAIL,
    panel_notice.c.test,
    panel_notice.c.request_id,
    panel_notice.c.execution_id,
    panel_notice.c.created_at,
    panel_notice.c.dismissed_at,
    panel_notice.c.dismissed_by,
)


@dataclass(frozen=True)
class NoticePage:
    limit: int
    include_dismissed: bool = False
    # The panel is the real runs' notices; a dry run's (marked test) only when asked for.
    tests: bool = False
    # (created_at, id) of the last notice of the previous page.
    after: tuple[datetime, uuid.UUID] | None = None


def notice_view(row: Row) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "category": row.category,
        "severity": row.severity,
        "title": row.title,
        "body": row.body,
        "email": row.email,
        "test": row.test,
        "requestId": str(row.request_id) if row.request_id else None,
        "executionId": str(row.execution_id) if row.execution_id else None,
        "createdAt": row.created_at.isoformat(),
        "dismissedAt": row.dismissed_at.isoformat() if row.dismissed_at else None,
        "dismissedBy": row.dismissed_by,
    }


class NoticeAccess:
    """The notices one organization sees."""

    def __init__(self, org_id: str) -> None:
        self.org_id = org_id

    def list_notices(self, conn: Connection, page: NoticePage) -> list[Row]:
        """Up to `page.limit` + 1 notices, newest first; the extra one says there are more."""
        conditions = [panel_notice.c.org_id == self.org_id, panel_notice.c.test.is_(page.tests)]
        if not page.include_dismissed:
            conditions.append(panel_notice.c.dismissed_at.is_(None))
        if page.after is not None:
            conditions.append(
                tuple_(panel_notice.c.created_at, panel_notice.c.id) < tuple_(*page.after)
            )
        query = (
            select(*_COLUMNS)
            .where(*conditions)
            .order_by(panel_notice.c.created_at.desc(), panel_notice.c.id.desc())
            .limit(page.limit + 1)
        )
        return list(conn.execute(query))

    def dismiss(self, conn: Connection, notice_id: uuid.UUID, actor: str) -> Row | None:
        """Dismiss the notice as `actor` (again is fine: the first time and its actor stay);
        None when not visible."""
        first = panel_notice.c.dismissed_at.is_(None)
        query = (
            update(panel_notice)
            .where(panel_notice.c.id == notice_id, panel_notice.c.org_id == self.org_id)
            .values(
                dismissed_at=func.coalesce(panel_notice.c.dismissed_at, func.now()),
                dismissed_by=case((first, actor), else_=panel_notice.c.dismissed_by),
            )
            .returning(*_COLUMNS)
        )
        return conn.execute(query).one_or_none()
