"""A PostgreSQL restart under a running API and worker: the reconnects stay within the pools.

The test's own server (never the suite's) logs every connection (`log_connections`). Under
API traffic it is shut down (fast: sessions end with 57P01), kept down until the API has
answered 503 problems for a while, and started again. Every process then reconnects after
a jittered pause: the server sees no more connections from the product than its pools
hold (OPERATIONS.md, "Connections per process"), never a storm of retries, and at no
moment more backends than that bound.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from tests.ha.api_traffic import ROOT, migrated, serve_api, spawn, traffic_through
from tests.ha.replication import ReplicatedPair, poll

pytestmark = pytest.mark.ha

DATABASE = "orquestador_restart"
RUNTIME_ROLE = "orquestador_restart_runtime"
JWT_SECRET = "restart-connections-signing-key-0123456789"
POOL = 4
API_WORKERS = 2
# OPERATIONS.md's bound: each API worker its pool plus one bell connection; a worker
# process its pool plus a protocol writer, a listener, a maintenance lock and up to
# four connections of the built-in adapters.
BOUND = API_WORKERS * (POOL + 1) + (POOL + 7)
FLOW = {
    "key": "restart-nothing",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "finish", "from": ["new"], "to": "done", "actions": []}],
}
AUTHORIZED = re.compile(
    r"^(\S+ \S+) \S+ \[\d+\] LOG:  connection authorized: .*application_name=orquestador"
)


def _product_connections(log: Path, since: datetime) -> list[datetime]:
    """When each connection of the product's processes was let in, from the server's log."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = AUTHORIZED.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f")
            if at >= since:
                found.append(at)
    return found


def _server_clock(server: ReplicatedPair) -> datetime:
    """The server's local time, as its log lines carry it."""
    rows = server.sql(server.primary, "SELECT localtimestamp")
    return rows[0][0]


def _backends(server: ReplicatedPair) -> int:
    rows = server.sql(
        server.primary,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'orquestador%'",
    )
    return int(rows[0][0])


def test_a_restart_brings_back_at_most_the_pools_connections_spread_over_time(
    server: ReplicatedPair, started: list[subprocess.Popen], tmp_path: Path
) -> None:
    base_env = migrated(server, DATABASE, RUNTIME_ROLE)

    env = {
        **base_env,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": server.primary.url(DATABASE, RUNTIME_ROLE),
        "DB_POOL_SIZE": str(POOL),
        "JWT_SECRET": JWT_SECRET,
        "LOG_LEVEL": "WARNING",
    }
    base = serve_api(started, env, tmp_path / "api.log", workers=API_WORKERS, threads=POOL)
    spawn(
        started,
        "worker",
        {
            **env,
            "WORKER_ENABLED": "true",
            "WORKER_CONCURRENCY": "4",
            "WORKER_POLL_MS": "100",
            "MAINTENANCE_INTERVAL_SECONDS": "1",
        },
        tmp_path / "worker.log",
    )
    traffic = traffic_through(base, JWT_SECRET, FLOW, "finish")

    senders = [threading.Thread(target=traffic.run, daemon=True) for _ in range(4)]
    for sender in senders:
        sender.start()
    peak = 0
    try:
        poll(lambda: len(traffic.accepted) >= 20, timeout=60, what="20 acceptances")
        server.stop_server(server.primary)
        stopped_at = time.monotonic()
        # Down long enough that every process has failed and backed off at least once.
        poll(
            lambda: (
                sum(1 for a in traffic.answers if a.sent > stopped_at and a.status == 503) >= 20
            ),
            timeout=30,
            what="503 answers while the server is down",
        )
        server.start_server(server.primary)
        restarted = _server_clock(server)
        started_at = time.monotonic()
        poll(
            lambda: len(traffic.accepted_after(started_at)) >= 20,
            timeout=60,
            what="20 acceptances after the restart",
        )
        # The backends of the product, sampled for ten more seconds.
        window_end = started_at + 10
        while time.monotonic() < window_end:
            peak = max(peak, _backends(server))
            time.sleep(0.1)  # a sampling rate: nothing waits on this
    finally:
        traffic.stop.set()
        for sender in senders:
            sender.join(60)

    after = _product_connections(server.primary.log, restarted)
    by_status = Counter(a.status for a in traffic.answers)
    spread = (max(after) - min(after)).total_seconds() if after else 0.0
    print(
        f"\nrestart: {len(after)} product connections since it (bound {BOUND}), "
        f"spread over {spread:.2f} s; peak {peak} backends; answers {dict(by_status)}"
    )
    assert set(by_status) <= {201, 202, 503}, by_status
    assert after, "no process reconnected"
    assert len(after) <= BOUND, f"{len(after)} connections after the restart, bound {BOUND}"
    assert peak <= BOUND, f"{peak} backends at once, bound {BOUND}"
