"""The worker's listener leaves a server that stops taking writes, and comes back to it.

After a failover the old primary may live on read-only, and a NOTIFY from the new primary
never reaches a LISTEN on it. The test's own server (never the suite's: the setting is
server-wide, and only a reload reaches a session already open) is turned read-only with
`ALTER SYSTEM SET default_transaction_read_only` under a listening ReadyListener whose
health check runs every 0.2 s: the listener must drop its connection, count one
reconnect, report itself not connected while every new session is read-only, and listen
again (a NOTIFY waking it) once the server takes writes.
"""

from __future__ import annotations

import logging
import re
import threading

import pytest
from prometheus_client import REGISTRY

from orquestador.config import libpq_url
from orquestador.db.schema import EXECUTION_READY_CHANNEL
from orquestador.worker.listener import ReadyListener
from tests.ha.replication import ReplicatedPair, poll

pytestmark = pytest.mark.ha

CONNECTED = "orquestador_listener_connected"
RECONNECTS = "orquestador_listener_reconnects_total"
LISTENER_LOGIN = re.compile(r"connection authorized: .*application_name=orquestador-listener")


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _listener_logins(server: ReplicatedPair) -> int:
    """Connections of the listener the server let in, from its log (log_connections)."""
    return len(LISTENER_LOGIN.findall(server.primary.log.read_text(errors="replace")))


def _read_only(server: ReplicatedPair, on: bool) -> None:
    setting = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    server.sql(server.primary, f"ALTER SYSTEM {setting}")
    server.sql(server.primary, "SELECT pg_reload_conf()")


def _notify_wakes(server: ReplicatedPair, wake: threading.Event) -> bool:
    wake.clear()
    server.sql(server.primary, f"NOTIFY {EXECUTION_READY_CHANNEL}")
    return wake.wait(5)


def test_the_listener_reconnects_away_from_a_read_only_server_and_comes_back(
    server: ReplicatedPair, caplog: pytest.LogCaptureFixture
) -> None:
    wake = threading.Event()
    listener = ReadyListener(libpq_url(server.primary.url()), wake, health_check_seconds=0.2)
    reconnects_before = _metric(RECONNECTS)
    listener.start()
    try:
        poll(listener.listening.is_set, timeout=15, what="the listener to listen")
        assert wake.wait(5)  # its first claim after connecting
        assert _metric(CONNECTED) == 1
        assert _notify_wakes(server, wake)

        with caplog.at_level(logging.WARNING, logger="orquestador.worker.listener"):
            _read_only(server, True)
            poll(lambda: not listener.listening.is_set(), timeout=10, what="the listener to leave")
            logins = _listener_logins(server)
            # Two more sessions opened and found read-only: still not listening.
            poll(
                lambda: _listener_logins(server) >= logins + 2,
                timeout=15,
                what="the listener to try again twice",
            )
            assert not listener.listening.is_set()
            assert _metric(CONNECTED) == 0
            assert listener.reconnects == 1
            assert _metric(RECONNECTS) == reconnects_before + 1
        reasons = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
        assert reasons and all("no longer takes writes" in reason for reason in reasons), reasons

        _read_only(server, False)
        poll(listener.listening.is_set, timeout=30, what="the listener to listen again")
        assert wake.wait(5)
        assert _metric(CONNECTED) == 1
        # Attempts refused by the check are not reconnects: one connection was lost.
        assert _metric(RECONNECTS) == reconnects_before + 1
        assert _notify_wakes(server, wake)
    finally:
        listener.stopped.set()
        listener.join(15)
    assert not listener.is_alive()
    assert _metric(CONNECTED) == 0
