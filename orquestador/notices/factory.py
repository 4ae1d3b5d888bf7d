"""The worker's mailer loop, built from the settings; registered in worker.background.

This module imports the mailer only when a worker builds its loops, so the worker's
background module can name the factory without the two importing each other.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from orquestador.config import Settings

if TYPE_CHECKING:
    from orquestador.notices.mailer import Mailer

log = logging.getLogger(__name__)


def mailer_loop(settings: Settings, engine: Engine, worker_id: str) -> Mailer | None:
    """The mailer of this worker, or None with SMTP_URL empty (e-mails stay queued)."""
    if not settings.smtp_url:
        log.info("SMTP_URL is empty: this worker delivers no e-mail; queued e-mails wait")
        return None
    from orquestador.notices.mailer import Mailer
    from orquestador.notices.smtp import SmtpSender, SmtpTarget

    target = SmtpTarget.parse(settings.smtp_url)
    log.info("mailer delivers over %s as %s", target.describe(), settings.smtp_from)
    return Mailer(engine, SmtpSender(target, settings.smtp_from), worker_id)
