"""The worker's mailer: claims due `email_outbox` rows one at a time and delivers them.

Each row is leased to one mailer before anything is sent; the claim commits first,
then the message goes out over SMTP, then the row is marked sent. A failure backs
off exponentially with full jitter and, after MAX_ATTEMPTS deliveries (or at once on
a permanent 5xx refusal), the row ends `failed` with a safe `last_error`. A crash
between the server accepting the message and the row being marked sent delivers it
again once the lease expires, with the same Message-ID: delivery is at least once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

from orquestador import tracing
from orquestador.backoff import Backoff
from orquestador.loop import Loop
from orquestador.notices.outbox import (
    ClaimedEmail,
    claim_due_emails,
    mark_failed,
    mark_retry,
    mark_sent,
)
from orquestador.notices.smtp import DeliveryFailed, OutgoingEmail, SmtpSender

log = logging.getLogger(__name__)

# Longer than one whole SMTP exchange may take (smtp.DELIVERY_SECONDS); short enough
# that a dead worker's row is not late for long.
LEASE_SECONDS = 60.0
POLL_SECONDS = 2.0
MAX_ATTEMPTS = 20
BACKOFF_BASE_SECONDS = 5.0
# 20 attempts span 3 to 6 hours of failures before a row is given up.
BACKOFF_CAP_SECONDS = 1800.0


@dataclass(frozen=True)
class MailerHooks:
    """Places tests stop a mailer at: after the claim committed, after the server took it."""

    after_claim: Callable[[ClaimedEmail], None] | None = None
    after_send: Callable[[ClaimedEmail], None] | None = None


class Mailer(Loop):
    """One worker's delivery loop; any number of them share the outbox safely."""

    def __init__(
        self,
        engine: Engine,
        sender: SmtpSender,
        owner: str,
        *,
        poll_seconds: float = POLL_SECONDS,
        lease_seconds: float = LEASE_SECONDS,
        max_attempts: int = MAX_ATTEMPTS,
        backoff: Backoff | None = None,
        hooks: MailerHooks | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        super().__init__("mailer", poll_seconds, wake)
        if sender.delivery_seconds >= lease_seconds:
            raise ValueError("an SMTP exchange must end before the mailer's lease does")
        self.engine = engine
        self.sender = sender
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        # Equal jitter: never a retry at once, and a burst of failures spreads out.
        self.backoff = backoff or Backoff(BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
        self.hooks = hooks or MailerHooks()

    def run_once(self) -> bool:
        # No connection is held while the SMTP server is talked to: the claim has
        # committed, and the row is settled on a connection of its own afterwards.
        with self.engine.connect() as conn:
            claimed = claim_due_emails(conn, self.owner, self.lease_seconds)
        for email in claimed:
            self.deliver(email)
        return bool(claimed)

    def deliver(self, email: ClaimedEmail) -> None:
        with tracing.span(
            "email.send",
            {"orquestador.email_id": email.id, "orquestador.attempt": email.attempt},
            parent=email.trace_parent,
            kind="client",
        ):
            self._deliver(email)

    def _deliver(self, email: ClaimedEmail) -> None:
        if self.hooks.after_claim:
            self.hooks.after_claim(email)
        outgoing = OutgoingEmail(email.message_id, email.recipients, email.subject, email.body)
        try:
            refused = self.sender.send(outgoing)
        except DeliveryFailed as exc:
            with self.engine.connect() as conn:
                self._failed(conn, email, exc)
            return
        except Exception as exc:
            # Unforeseen: counted like any failed delivery, so the bound still applies
            # and one row cannot stall the loop. Only the class: the text may hold data.
            log.exception("e-mail delivery raised %s", type(exc).__name__, extra=email.log_extra)
            unforeseen = DeliveryFailed(f"unexpected {type(exc).__name__}", permanent=False)
            with self.engine.connect() as conn:
                self._failed(conn, email, unforeseen)
            return
        if self.hooks.after_send:
            self.hooks.after_send(email)
        with self.engine.connect() as conn:
            marked = mark_sent(conn, email, self.owner)
        tracing.note("orquestador.outcome", "delivered")
        if not marked:
            log.warning("e-mail delivered after its lease was lost", extra=email.log_extra)
            return
        if refused:
            log.warning(
                "e-mail delivered; the server refused %d recipient(s)",
                len(refused),
                extra=email.log_extra,
            )
        else:
            log.info("e-mail delivered", extra=email.log_extra)

    def _failed(self, conn: Connection, email: ClaimedEmail, exc: DeliveryFailed) -> None:
        if exc.permanent or email.attempt >= self.max_attempts:
            mark_failed(conn, email, self.owner, exc.safe_text)
            tracing.note("orquestador.outcome", "failed")
            log.warning(
                "e-mail given up after %d attempt(s): %s",
                email.attempt,
                exc.safe_text,
                extra=email.log_extra,
            )
            return
        delay = self.backoff.equal_jitter(email.attempt)
        mark_retry(conn, email, self.owner, delay, exc.safe_text)
        tracing.note("orquestador.outcome", "retry")
        log.info(
            "e-mail not delivered, next try in %.0f s: %s",
            delay,
            exc.safe_text,
            extra=email.log_extra,
        )
