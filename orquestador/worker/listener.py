"""Wakes the scheduler when a transition is accepted: LISTEN on a dedicated connection."""

from __future__ import annotations

import logging
import threading

import psycopg
from sqlalchemy.engine import URL

from orquestador.config import libpq_url
from orquestador.db.schema import EXECUTION_READY_CHANNEL
from orquestador.worker.messages import error_line

log = logging.getLogger(__name__)


def libpq_conninfo(url: URL) -> str:
    """A libpq URI for the engine's URL (psycopg itself, without SQLAlchemy's driver name)."""
    return libpq_url(url)


class ReadyListener(threading.Thread):
    """Sets `wake` on every notification; polling stays the fallback if this connection fails."""

    def __init__(
        self, conninfo: str, wake: threading.Event, reconnect_seconds: float = 2.0
    ) -> None:
        super().__init__(name="orquestador-listener", daemon=True)
        self._conninfo = conninfo
        self._wake = wake
        self._reconnect_seconds = reconnect_seconds
        self.stopped = threading.Event()
        self.listening = threading.Event()  # set while LISTEN is in effect

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with psycopg.connect(
                    self._conninfo, autocommit=True, application_name="orquestador-listener"
                ) as conn:
                    conn.execute(f"LISTEN {EXECUTION_READY_CHANNEL}")
                    self.listening.set()
                    # Anything accepted while we were not listening is found by this claim.
                    self._wake.set()
                    while not self.stopped.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._wake.set()
            except Exception as exc:
                self.listening.clear()
                if self.stopped.is_set():
                    return  # stopping: the connection may go with the database
                log.warning("ready listener disconnected: %s", error_line(exc))
                self.stopped.wait(self._reconnect_seconds)
