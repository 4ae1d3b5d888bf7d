"""The database connection of stateful built-in adapters, made on first use."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from orquestador.db.engine import make_engine

# Adapter calls run on the worker's call threads; a few connections serve them.
POOL_SIZE = 4
# A built-in's call is a statement or two; it must still stay below any lease the operator
# chose, or the worker would refuse to start.
BUILTIN_TIMEOUT_SECONDS = 10.0


def builtin_timeout_seconds(lease_seconds: float) -> float:
    """The timeout of a built-in adapter's call: 10 s, or half the lease when that is less."""
    return min(BUILTIN_TIMEOUT_SECONDS, lease_seconds / 2)


class BuiltinDatabase:
    """A lazily created engine: registering adapters never connects."""

    def __init__(self, url: str, *, prepare: bool = True) -> None:
        self._url = url
        self._prepare = prepare
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = make_engine(
                    self._url,
                    pool_size=POOL_SIZE,
                    application_name="orquestador-adapters",
                    hide_parameters=True,
                    prepare=self._prepare,
                )
            return self._engine
