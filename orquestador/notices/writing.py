"""Writing a panel notice keyed by its external key, with its outbox row and audit, at once.

One transaction holds the notice, the `email_outbox` row (when the e-mail goes out)
and the NOTICE_WRITTEN audit row, so a notice is never mailed without being recorded
and never recorded as queued without its e-mail. The notice is keyed by the step's
external key: a retry of the same step finds the first notice and writes nothing,
so it never queues a second e-mail.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from orquestador import tracing
from orquestador.db.schema import audit_event, email_outbox, panel_notice
from orquestador.notices.preferences import email_decision
from orquestador.notices.vocabulary import AUDIT_NOTICE_WRITTEN, EmailOutcome

MESSAGE_ID_DOMAIN = "orquestador"


def message_id_for(external_key: str) -> str:
    """The Message-ID of a notice's e-mail: the same for every delivery of it.

    Derived from the external key, so a message delivered again after a crash carries
    the header of the first delivery and a receiver can drop the copy.
    """
    digest = hashlib.sha256(external_key.encode("utf-8")).hexdigest()
    return f"<{digest}@{MESSAGE_ID_DOMAIN}>"


@dataclass(frozen=True)
class NoticeDraft:
    org_id: str
    external_key: str
    title: str
    body: str
    severity: str
    category: str
    request_id: uuid.UUID | None
    execution_id: uuid.UUID | None
    actor: str | None = None
    # Lines the e-mail carries below the body (what it is about, where to look); the
    # panel notice is the body alone.
    email_footer: str = ""


@dataclass(frozen=True)
class WrittenNotice:
    notice_id: uuid.UUID
    email: EmailOutcome
    # False when the notice was already there: a retry of the same step.
    created: bool


def write_notice(
    conn: Connection, draft: NoticeDraft, *, email_requested: bool, test: bool = False
) -> WrittenNotice:
    """Write the notice (and maybe its e-mail) once per external key; the caller commits.

    `test` marks a dry run's notice: it is written, and never mailed.
    """
    if test:
        outcome, recipients = EmailOutcome.SIMULATION, []
    elif not email_requested:
        outcome, recipients = EmailOutcome.OFF_ON_NODE, []
    else:
        outcome, recipients = email_decision(conn, draft.org_id, draft.category)
    notice_id = conn.scalar(
        pg_insert(panel_notice)
        .values(
            org_id=draft.org_id,
            category=draft.category,
            title=draft.title,
            body=draft.body,
            severity=draft.severity,
            request_id=draft.request_id,
            execution_id=draft.execution_id,
            external_key=draft.external_key,
            test=test,
            email=outcome.value,
        )
        .on_conflict_do_nothing(index_elements=[panel_notice.c.external_key])
        .returning(panel_notice.c.id)
    )
    if notice_id is None:
        # Written by an earlier attempt of this step (or one still committing, which
        # the insert waited for): answer what that attempt decided, write nothing.
        first = conn.execute(
            select(panel_notice.c.id, panel_notice.c.email).where(
                panel_notice.c.external_key == draft.external_key,
                panel_notice.c.org_id == draft.org_id,
            )
        ).one()
        return WrittenNotice(first.id, EmailOutcome(first.email), created=False)
    if outcome is EmailOutcome.QUEUED:
        conn.execute(
            insert(email_outbox).values(
                org_id=draft.org_id,
                notice_id=notice_id,
                message_id=message_id_for(draft.external_key),
                recipients=recipients,
                subject=draft.title,
                body=draft.body + draft.email_footer,
                # The step's span: the delivery, later and elsewhere, joins its trace.
                trace_parent=tracing.current_traceparent(),
            )
        )
    conn.execute(
        insert(audit_event).values(
            org_id=draft.org_id,
            kind=AUDIT_NOTICE_WRITTEN,
            request_id=draft.request_id,
            execution_id=draft.execution_id,
            actor=draft.actor,
            detail={"noticeId": str(notice_id), "email": outcome.value, "test": test},
        )
    )
    return WrittenNotice(notice_id, outcome, created=True)
