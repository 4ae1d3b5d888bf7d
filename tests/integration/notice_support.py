"""Arranging notices, preferences and outbox rows on the test database, and mailers to deliver."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, text

from orquestador.backoff import Backoff
from orquestador.notices.mailer import Mailer, MailerHooks
from orquestador.notices.preferences import save_preferences
from orquestador.notices.smtp import SmtpSender, SmtpTarget
from orquestador.notices.vocabulary import CATEGORY_AUTOMATION
from orquestador.notices.writing import NoticeDraft, WrittenNotice, write_notice

ORG = "org-test"
SENDER = "Orquestador <orquestador@example.com>"
RECIPIENTS = ["ops@example.com", "oncall@example.com"]


def set_preferences(
    engine: Engine,
    org: str = ORG,
    *,
    opt_out: list[str] | None = None,
    recipients: list[str] | None = None,
) -> None:
    with engine.begin() as conn:
        save_preferences(conn, org, opt_out or [], RECIPIENTS if recipients is None else recipients)


def queue_email(
    engine: Engine,
    key: str | None = None,
    *,
    org: str = ORG,
    execution_id: uuid.UUID | None = None,
) -> WrittenNotice:
    """A notice whose node ticked `email`, as notify@1 writes it."""
    key = key or f"{uuid.uuid4()}:notify"
    draft = NoticeDraft(
        org_id=org,
        external_key=key,
        title=f"Disk almost full ({key[:8]})",
        body="Machine m-1 has 3% free on /var.",
        severity="warning",
        category=CATEGORY_AUTOMATION,
        request_id=None,
        execution_id=execution_id,
    )
    with engine.begin() as conn:
        return write_notice(conn, draft, email_requested=True)


def outbox(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT * FROM email_outbox ORDER BY created_at, id")).all()


def make_outbox_due(engine: Engine) -> None:
    """What the passing of time does to a backoff and to a dead mailer's lease."""
    with engine.begin() as conn:
        conn.execute(
            text("""UPDATE email_outbox
                    SET next_attempt_at = clock_timestamp() - interval '1 s',
                        lease_expires_at = CASE WHEN lease_expires_at IS NULL THEN NULL
                                                ELSE clock_timestamp() - interval '1 s' END
                    WHERE status = 'pending'""")
        )


def sender_for(url: str, **kwargs: Any) -> SmtpSender:
    return SmtpSender(SmtpTarget.parse(url), SENDER, **kwargs)


def new_mailer(
    engine: Engine,
    url: str,
    owner: str = "mailer-1",
    *,
    hooks: MailerHooks | None = None,
    sender: SmtpSender | None = None,
    **kwargs: Any,
) -> Mailer:
    kwargs.setdefault("poll_seconds", 0.05)
    kwargs.setdefault("backoff", Backoff(base_seconds=0.2, cap_seconds=0.5))
    return Mailer(
        engine, sender or sender_for(url, timeout_seconds=5), owner, hooks=hooks, **kwargs
    )


@contextmanager
def running(*mailers: Mailer) -> Iterator[None]:
    for mailer in mailers:
        mailer.start()
    try:
        yield
    finally:
        for mailer in mailers:
            mailer.stop()
        for mailer in mailers:
            mailer.join(10)
