"""The mailer's side of `email_outbox`: claim due rows under a lease, then settle each one.

A claim commits before anything is sent, so no transaction stays open across SMTP.
A row is taken only when no live lease covers it; a worker that dies holding one
leaves the row to be claimed again once the lease expires, and delivered again with
the same Message-ID (at least once). Every settling write names the lease owner, so
a worker whose lease expired and was taken over cannot overwrite the new holder.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from orquestador.domain.statuses import OutboxStatus
from orquestador.notices.vocabulary import AUDIT_NOTICE_EMAIL_SETTLED, EmailOutcome

# One row per claim: each delivery gets the whole lease, however slow the server is.
_CLAIM = text(f"""
    -- Due, pending rows no live lease covers; SKIP LOCKED lets mailers share the table
    -- without waiting on each other's claims.
    WITH due AS (
        SELECT id FROM email_outbox
        WHERE status = '{OutboxStatus.PENDING}'
          AND next_attempt_at <= clock_timestamp()
          AND (lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE email_outbox AS o
    SET lease_owner = :owner,
        lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
        attempts = o.attempts + 1
    FROM due
    WHERE o.id = due.id
    RETURNING o.id, o.org_id, o.message_id, o.recipients, o.subject, o.body, o.attempts,
              o.trace_parent
""")

# A settled row records what became of its notice's e-mail in an audit row written by
# the same statement (NOTICE_EMAIL_SETTLED, {noticeId, email: delivered | failed}); the
# notice as people read it says so. A row settled twice (a lost lease) records nothing
# the second time: the predicate on the lease owner and status matches no row.
_SETTLE = f"""
    WITH settled AS (
        UPDATE email_outbox
        SET {{assignments}}, lease_owner = NULL, lease_expires_at = NULL
        WHERE id = :id AND lease_owner = :owner AND status = '{OutboxStatus.PENDING}'
        RETURNING notice_id
    ), told AS (
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, detail)
        SELECT n.org_id, :kind, n.request_id, n.execution_id,
               jsonb_build_object('noticeId', n.id::text, 'email', CAST(:email AS text))
        FROM settled JOIN panel_notice AS n ON n.id = settled.notice_id
    )
    SELECT count(*) FROM settled
"""

_MARK_SENT = text(
    _SETTLE.format(
        assignments=f"status = '{OutboxStatus.SENT}', sent_at = clock_timestamp(),"
        " last_error = NULL"
    )
).bindparams(kind=AUDIT_NOTICE_EMAIL_SETTLED, email=EmailOutcome.DELIVERED.value)

_MARK_RETRY = text(f"""
    UPDATE email_outbox
    SET next_attempt_at = clock_timestamp() + make_interval(secs => :delay),
        lease_owner = NULL, lease_expires_at = NULL, last_error = :error
    WHERE id = :id AND lease_owner = :owner AND status = '{OutboxStatus.PENDING}'
""")

_MARK_FAILED = text(
    _SETTLE.format(assignments=f"status = '{OutboxStatus.FAILED}', last_error = :error")
).bindparams(kind=AUDIT_NOTICE_EMAIL_SETTLED, email=EmailOutcome.FAILED.value)


@dataclass(frozen=True)
class ClaimedEmail:
    id: uuid.UUID
    org_id: str
    message_id: str
    recipients: list[str]
    subject: str
    body: str
    # This delivery's number, the claim included: a crash mid-delivery counts.
    attempt: int
    # The W3C traceparent of the step that queued it: the delivery continues its trace.
    trace_parent: str | None = None

    @property
    def log_extra(self) -> dict[str, Any]:
        return {"email_id": str(self.id), "org_id": self.org_id, "attempt": self.attempt}


def claim_due_emails(
    conn: Connection, owner: str, lease_seconds: float, limit: int = 1
) -> list[ClaimedEmail]:
    """Lease up to `limit` due rows to `owner` and commit the claim."""
    with conn.begin():
        rows = conn.execute(
            _CLAIM, {"owner": owner, "lease_seconds": lease_seconds, "limit": limit}
        ).all()
    return [
        ClaimedEmail(
            id=row.id,
            org_id=row.org_id,
            message_id=row.message_id,
            recipients=list(row.recipients),
            subject=row.subject,
            body=row.body,
            attempt=row.attempts,
            trace_parent=row.trace_parent,
        )
        for row in rows
    ]


def mark_sent(conn: Connection, email: ClaimedEmail, owner: str) -> bool:
    """False when the lease was lost meanwhile: the new holder settles the row."""
    with conn.begin():
        return conn.execute(_MARK_SENT, {"id": email.id, "owner": owner}).scalar_one() == 1


def mark_retry(
    conn: Connection, email: ClaimedEmail, owner: str, delay_seconds: float, error: str
) -> bool:
    with conn.begin():
        params = {"id": email.id, "owner": owner, "delay": delay_seconds, "error": error}
        return conn.execute(_MARK_RETRY, params).rowcount == 1


def mark_failed(conn: Connection, email: ClaimedEmail, owner: str, error: str) -> bool:
    with conn.begin():
        params = {"id": email.id, "owner": owner, "error": error}
        return conn.execute(_MARK_FAILED, params).scalar_one() == 1
