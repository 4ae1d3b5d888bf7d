"""The commands that work on the database directly (as the owner role, or reading the
history): an engine on the URL they were given, else on this folder's embedded database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from orquestador.config import Settings, sqlalchemy_url

if TYPE_CHECKING:
    from sqlalchemy import Engine


@contextmanager
def direct_engine(settings: Settings, url: str) -> Iterator[Engine]:
    """An engine without a pool on `url`; with no URL, on the `orquestador dev` database of
    this folder, started for the command and stopped after unless it was already running."""
    from sqlalchemy import create_engine, pool

    local = None
    if not url:
        from orquestador.db.local import start_local_database

        local = start_local_database(settings.home_path)
        url = local.migration_url
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()
        # A server this command found running (a dev's) keeps running.
        if local is not None and local.server.adopted_pid is None:
            local.server.stop()
