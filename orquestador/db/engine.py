"""Engine creation and the classification of database errors worth retrying."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from orquestador.config import sqlalchemy_url

# SQLSTATE classes that say "try again later" rather than "this is wrong":
# 08 connection exception, 40 transaction rollback (serialization, deadlock),
# 53 insufficient resources, 57 operator intervention (e.g. admin shutdown).
_RETRIABLE_SQLSTATE_CLASSES = ("08", "40", "53", "57")
# And one state of its own: a lock not had within lock_timeout (55P03) passes too.
_LOCK_NOT_AVAILABLE = "55P03"


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    application_name: str = "orquestador",
    ping_after_idle_seconds: float | None = None,
    lock_timeout_ms: int | None = None,
    statement_timeout_ms: int | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine on psycopg 3 with a bounded pool; build it after any fork.

    By default every checkout pings the connection first. With
    `ping_after_idle_seconds`, only a connection that sat in the pool at least that
    long is pinged: a busy process checks out connections many times a second, and
    one that was just used is as alive as a ping would show.

    `lock_timeout_ms` and `statement_timeout_ms` bound every statement of every
    connection (set at connection start, so they cost no round trip). JIT is off: the
    product's statements are short, and the claim's plan, whose costs the planner
    overestimates (it cannot read a limit that a subquery computes), once took a second
    of JIT compilation for a millisecond of work.
    """
    connect_args: dict[str, Any] = {"application_name": application_name, "connect_timeout": 10}
    options = [
        f"-c {name}={value}"
        for name, value in (
            ("jit", "off"),
            ("lock_timeout", lock_timeout_ms),
            ("statement_timeout", statement_timeout_ms),
        )
        if value is not None
    ]
    connect_args["options"] = " ".join(options)
    engine = create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=kwargs.pop("max_overflow", 2),
        pool_pre_ping=ping_after_idle_seconds is None,
        connect_args=connect_args,
        **kwargs,
    )
    if ping_after_idle_seconds is not None:
        _ping_after_idle(engine, ping_after_idle_seconds)
    return engine


def _ping_after_idle(engine: Engine, idle_seconds: float) -> None:
    @event.listens_for(engine.pool, "checkin")
    def _checked_in(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _checked_out(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool discards this connection and checks out (or opens) another.
            raise DisconnectionError(f"connection idle for {idle_seconds}s is gone") from exc


def is_retriable(error: BaseException) -> bool:
    """True when the database said the failure is transient (connection, deadlock, resources)."""
    if isinstance(error, OperationalError) and error.connection_invalidated:
        return True
    if isinstance(error, DBAPIError):
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        if sqlstate.startswith(_RETRIABLE_SQLSTATE_CLASSES) or sqlstate == _LOCK_NOT_AVAILABLE:
            return True
        return isinstance(error, OperationalError) and not sqlstate
    return False
