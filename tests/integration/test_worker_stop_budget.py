"""A worker whose database vanished still stops within its budget when told to.

The database host disappears without a word (a black hole: no reset, nothing answered), so
the scheduler's claim, the loops' statements and any new connection wait forever. A
service manager then sends SIGTERM and SIGKILLs after `TimeoutStopSec` (40 s in the shipped
unit). The worker must exit by itself within WORKER_DRAIN_SECONDS + STOP_GRACE_SECONDS,
whatever its threads are stuck in: joining each thread in turn for its own 10 s once took
up to 90 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orquestador.worker.daemon import STOP_GRACE_SECONDS
from tests.db_support import TestDatabase
from tests.integration.blackhole import Blackhole
from tests.integration.worker_support import wait_until

DRAIN_SECONDS = 1
# Process start-up and interpreter exit on a busy machine: not part of the budget.
EXIT_MARGIN_SECONDS = 10


def test_a_worker_whose_database_vanished_stops_within_its_budget(database: TestDatabase) -> None:
    url = database.runtime_url
    socket_dir = url.query.get("host")  # the embedded server listens on a socket only
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        hole = Blackhole(f"{socket_dir}/.s.PGSQL.{url.port or 5432}")
    else:
        hole = Blackhole((url.host or "127.0.0.1", url.port or 5432))
    query = {name: value for name, value in url.query.items() if name != "host"}
    through_hole = url.set(host="127.0.0.1", port=hole.port, query=query).render_as_string(
        hide_password=False
    )
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DATABASE_URL=through_hole,
        WORKER_ENABLED="true",
        WORKER_POLL_MS="50",
        WORKER_DRAIN_SECONDS=str(DRAIN_SECONDS),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "orquestador.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Running: the scheduler claims every 50 ms on a pooled connection (start-up and
        # the listener send a dozen messages or so; this many means claims are flowing).
        # A busy machine may take seconds to start the process: the bound is generous.
        wait_until(lambda: hole.sent() >= 40, timeout=120, what="the worker's claims to flow")
        hole.vanish()
        # The scheduler's next claim (50 ms later at most) now waits on the hole for ever.
        wait_until(lambda: hole.swallowed() >= 1, timeout=60, what="a claim to wait on the hole")
        asked = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        budget = DRAIN_SECONDS + STOP_GRACE_SECONDS
        try:
            worker.wait(budget + EXIT_MARGIN_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker did not stop within {budget + EXIT_MARGIN_SECONDS} s of SIGTERM"
            ) from None
        took = time.monotonic() - asked
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        hole.close()
    log = worker.stderr.read() if worker.stderr else ""
    assert took <= budget + EXIT_MARGIN_SECONDS, log
    # Stopped in an orderly way, and said what it left behind.
    assert "worker stopped" in log
    assert "still running after the stop budget" in log
