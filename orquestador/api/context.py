"""What every view needs from the app: settings, engine, token verifier, capabilities."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from flask import current_app
from sqlalchemy import Engine

from orquestador.config import Settings
from orquestador.db.engine import make_engine
from orquestador.errors import DatabaseUnavailable

EXTENSION_KEY = "orquestador"

# Sized for threaded servers and tests that drive one app from many threads; a sync
# gunicorn worker uses one connection at a time.
API_POOL_SIZE = 10
API_MAX_OVERFLOW = 10


class LazyEngine:
    """Builds the engine on first use in each process, so no pool crosses a gunicorn fork."""

    def __init__(
        self, url: str, engine: Engine | None = None, settings: Settings | None = None
    ) -> None:
        self._url = url
        self._settings = settings
        self._engine = engine
        self._injected = engine is not None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def get(self) -> Engine:
        with self._lock:
            if self._injected:
                assert self._engine is not None
                return self._engine
            if self._engine is None or self._pid != os.getpid():
                if not self._url:
                    raise DatabaseUnavailable("DATABASE_URL is not set")
                # hide_parameters keeps request data out of logged database errors.
                pool_size, max_overflow = API_POOL_SIZE, API_MAX_OVERFLOW
                prepare = True
                if self._settings is not None:
                    prepare = self._settings.db_prepare
                    if self._settings.db_pool_size:
                        pool_size, max_overflow = self._settings.pool_size(API_POOL_SIZE)
                self._engine = make_engine(
                    self._url,
                    pool_size=pool_size,
                    max_overflow=max_overflow,
                    application_name="orquestador-api",
                    hide_parameters=True,
                    prepare=prepare,
                )
                self._pid = os.getpid()
            return self._engine

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None and not self._injected:
                self._engine.dispose()
                self._engine = None


class BearerVerifier(Protocol):
    """What the scope decorator asks of a verifier: the caller a token names, or a refusal.

    The API's is `auth.TokenVerifier`; it is described here rather than imported
    because auth reads this context, and the context need not know auth.
    """

    def verify(self, token: str, *, for_pages: bool = False) -> Any: ...


@dataclass(frozen=True)
class ApiContext:
    settings: Settings
    engine: LazyEngine
    verifier: BearerVerifier
    # Why a published flow may not name (capability, version), or None when it may:
    # `api.capabilities.capability_checker`.
    capability_problem: Callable[[str, int], str | None]


def api_context() -> ApiContext:
    return current_app.extensions[EXTENSION_KEY]


def engine() -> Engine:
    return api_context().engine.get()
