"""The worker's platform event consumer, built from the settings; named in worker.background.

The consumer module imports the worker's Loop; this one imports the consumer only when a
worker builds its loops, so the worker's background module can name the factory without
the two importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine

from orquestador.config import Settings

if TYPE_CHECKING:
    from orquestador.automation.consumer import PlatformEventConsumer


def platform_event_consumer(
    settings: Settings, engine: Engine, worker_id: str
) -> PlatformEventConsumer:
    """Every worker consumes the events the platform inserted itself (SKIP LOCKED shares them)."""
    from orquestador.automation.consumer import PlatformEventConsumer

    return PlatformEventConsumer(engine, max_attempts=settings.execution_max_attempts)
