"""Engine creation and the classification of database errors worth retrying."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from orquestador.backoff import Backoff
from orquestador.config import sqlalchemy_url

# SQLSTATE classes that say "try again later" rather than "this is wrong":
# 08 connection exception, 40 transaction rollback (serialization, deadlock),
# 53 insufficient resources, 57 operator intervention (e.g. admin shutdown).
_RETRIABLE_SQLSTATE_CLASSES = ("08", "40", "53", "57")
# And one state of its own: a lock not had within lock_timeout (55P03) passes too.
_LOCK_NOT_AVAILABLE = "55P03"
# The server this connection reached is no longer the primary, or is going away:
# 25006 a write refused by a read-only server (a demoted primary, a standby), 57P01
# administrator shutdown, 57P02 crash shutdown, 57P03 cannot connect now (starting up,
# shutting down, in recovery). Every connection of the pool may be on that server, so
# the whole pool is recycled and the next connection goes through the host list again.
FAILOVER_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
# Reconnects after a failover: every process and thread of the fleet fails at the same
# instant, so full jitter spreads them the widest; short, as the new primary is up.
FAILOVER_RECONNECT = Backoff(base_seconds=0.05, cap_seconds=2.0)

log = logging.getLogger(__name__)


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    application_name: str = "orquestador",
    ping_after_idle_seconds: float | None = None,
    lock_timeout_ms: int | None = None,
    statement_timeout_ms: int | None = None,
    prepare: bool = True,
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
    if not prepare:
        # Behind PgBouncer in transaction mode without max_prepared_statements, a statement
        # prepared on one server connection is unknown on the next: prepare nothing.
        connect_args["prepare_threshold"] = None
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
    _recycle_on_failover(engine)
    return engine


def is_failover_error(error: BaseException) -> bool:
    """True when the server said it cannot take this work any more (see FAILOVER_SQLSTATES)."""
    error = getattr(error, "orig", None) or error
    return getattr(error, "sqlstate", None) in FAILOVER_SQLSTATES


class ReconnectBackoff:
    """Jittered, doubling waits before reconnecting, shared by the threads of one engine."""

    def __init__(self, backoff: Backoff = FAILOVER_RECONNECT) -> None:
        self.backoff = backoff
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self) -> None:
        with self._lock:
            self.failures += 1

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0

    def delay(self) -> float:
        """Seconds to wait before the next connection attempt: 0 while all is well."""
        with self._lock:
            failures = self.failures
        return 0.0 if failures == 0 else self.backoff.full_jitter(failures)


def _recycle_on_failover(engine: Engine) -> None:
    backoff = ReconnectBackoff()

    @event.listens_for(engine, "handle_error")
    def _classify(context: ExceptionContext) -> None:
        original = context.original_exception
        lost = isinstance(original, psycopg.OperationalError) and not getattr(
            original, "sqlstate", None
        )
        if is_failover_error(original) or lost or context.is_disconnect:
            # SQLAlchemy then invalidates this connection and every one the pool holds
            # that is older (invalidate_pool_on_disconnect).
            if not context.is_disconnect:
                log.warning(
                    "database refused or lost (%s): recycling the connection pool",
                    getattr(original, "sqlstate", None) or type(original).__name__,
                )
            context.is_disconnect = True
            backoff.failed()

    @event.listens_for(engine, "do_connect")
    def _wait_before_reconnecting(*_: Any) -> None:
        delay = backoff.delay()
        if delay:
            time.sleep(delay)  # a bounded, jittered pause: the reconnect storm's spreader

    @event.listens_for(engine, "connect")
    def _connected(*_: Any) -> None:
        backoff.succeeded()


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
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if is_failover_error(error):
        return True
    if isinstance(error, DBAPIError):
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        if sqlstate.startswith(_RETRIABLE_SQLSTATE_CLASSES) or sqlstate == _LOCK_NOT_AVAILABLE:
            return True
        return isinstance(error, OperationalError) and not sqlstate
    return False
