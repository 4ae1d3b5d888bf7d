"""Wakes the scheduler when a transition is accepted: LISTEN on a dedicated connection."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from sqlalchemy.engine import URL

from orquestador.backoff import Backoff
from orquestador.config import libpq_url
from orquestador.db.schema import EXECUTION_READY_CHANNEL
from orquestador.loop import Loop
from orquestador.metrics import LISTENER_CONNECTED, LISTENER_RECONNECTS_TOTAL
from orquestador.redaction import error_line

log = logging.getLogger(__name__)

# How often a quiet listening connection checks that its server still takes writes:
# after a failover the old primary may live on, read-only or cut off, and NOTIFY from
# the new primary never reaches it. Polling covers what is missed until then.
HEALTH_CHECK_SECONDS = 10.0
# Reconnects of the listening connection: never at once (equal jitter), up to the cap.
LISTENER_RECONNECT = Backoff(base_seconds=0.2, cap_seconds=10.0)


class ListenerServerReadOnly(Exception):
    """The listening connection's server no longer takes writes; reconnecting."""


def libpq_conninfo(url: URL) -> str:
    """A libpq URI for the engine's URL (psycopg itself, without SQLAlchemy's driver name)."""
    return libpq_url(url)


class ReadyListener(Loop):
    """Sets `ready` on every notification; polling stays the fallback if this connection fails.

    A round is one connection's life: it returns when the loop stops, or fails when the
    connection does (then the loop reconnects after LISTENER_RECONNECT's backoff).
    """

    def __init__(
        self,
        conninfo: str,
        ready: threading.Event,
        health_check_seconds: float = HEALTH_CHECK_SECONDS,
    ) -> None:
        super().__init__("listener", health_check_seconds, failure_backoff=LISTENER_RECONNECT)
        self._conninfo = conninfo
        self._ready = ready  # the scheduler's wake
        self._health_check_seconds = health_check_seconds
        self.listening = threading.Event()  # set while LISTEN is in effect
        self.reconnects = 0  # connections lost and opened again, since start
        self._was_listening = False

    def run_once(self) -> bool:
        try:
            with psycopg.connect(
                self._conninfo,
                autocommit=True,
                application_name="orquestador-listener",
                connect_timeout=10,
            ) as conn:
                self._check_health(conn)
                conn.execute(f"LISTEN {EXECUTION_READY_CHANNEL}")
                self.settled()
                self.listening.set()
                LISTENER_CONNECTED.set(1)
                # Anything accepted while we were not listening is found by this claim.
                self._ready.set()
                checked = time.monotonic()
                while not self.stopped.is_set():
                    for _ in conn.notifies(timeout=0.5, stop_after=1):
                        self._ready.set()
                    if time.monotonic() - checked >= self._health_check_seconds:
                        self._check_health(conn)
                        checked = time.monotonic()
        finally:
            self._was_listening = self.listening.is_set()
            self.listening.clear()
            LISTENER_CONNECTED.set(0)
        return False

    def failed(self, exc: Exception, wait_seconds: float) -> None:
        if self._was_listening:
            self.reconnects += 1
            LISTENER_RECONNECTS_TOTAL.inc()
        log.warning(
            "ready listener disconnected: %s; reconnecting in %.1f s",
            error_line(exc),
            wait_seconds,
        )

    def recovered(self, failures: int) -> None:
        log.info("ready listener listening again")

    @staticmethod
    def _check_health(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        row = conn.execute(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"
        ).fetchone()
        if row and row[0]:
            raise ListenerServerReadOnly(
                "the listening connection's server no longer takes writes; reconnecting"
            )
