"""The loops a worker runs beside its scheduler: the platform event consumer, the schedule
firer, bulk actions, the mailer, and maintenance. The daemon starts them after the scheduler
and stops them before it reports itself stopped.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from orquestador.automation.consumer import PlatformEventConsumer
from orquestador.automation.firing import ScheduleFirer
from orquestador.config import Settings
from orquestador.loop import Loop
from orquestador.notices.mailer import Mailer
from orquestador.notices.smtp import SmtpSender, SmtpTarget
from orquestador.worker.bulk_runner import BulkRunner
from orquestador.worker.maintenance import MaintenanceLoop
from orquestador.worker.queue_gauges import QueueGauges

log = logging.getLogger(__name__)


def mailer(settings: Settings, engine: Engine, worker_id: str) -> Mailer | None:
    """The mailer of this worker, or None with SMTP_URL empty (e-mails stay queued)."""
    if not settings.smtp_url:
        log.info("SMTP_URL is empty: this worker delivers no e-mail; queued e-mails wait")
        return None
    target = SmtpTarget.parse(settings.smtp_url)
    log.info("mailer delivers over %s as %s", target.describe(), settings.smtp_from)
    return Mailer(engine, SmtpSender(target, settings.smtp_from), worker_id)


def background_loops(settings: Settings, engine: Engine, worker_id: str) -> list[Loop]:
    """Every loop this worker runs; the mailer only when SMTP_URL is set.

    Every worker consumes platform events, fires schedules and acts on bulk actions' items
    (SKIP LOCKED shares them all) and runs maintenance (its advisory lock lets one worker at
    a time do the work).
    """
    maintenance = MaintenanceLoop(settings, engine, worker_id)
    loops: list[Loop] = [
        PlatformEventConsumer(engine, max_attempts=settings.execution_max_attempts),
        ScheduleFirer(
            engine,
            max_attempts=settings.execution_max_attempts,
            open_limit=lambda org: settings.quotas_for(org).open_executions,
        ),
        BulkRunner(engine, claims_budget=settings.execution_max_attempts),
        maintenance,
        QueueGauges(maintenance),
    ]
    found = mailer(settings, engine, worker_id)
    if found is not None:
        loops.append(found)
    return loops
