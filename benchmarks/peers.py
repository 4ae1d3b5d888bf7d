"""Our worker beside PgQueuer and DBOS Transact, on the same server, in the same run.

    python benchmarks/peers.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

Installs pgqueuer[asyncpg]==1.6.0 and dbos==3.4.0 into a throwaway virtual environment
in the system temporary folder (removed afterwards unless --venv names one to keep and
reuse), then, each on a fresh database of its own created on the DSN's server and
dropped afterwards:

- PgQueuer: N no-op jobs enqueued up front, one QueueManager on one asyncpg connection
  with an entrypoint of concurrency_limit=10 (batch_size 10, the default), drain mode.
  Rate: N over the first `picked` to the last `successful` row of its own log.
- DBOS Transact: N two-step workflows (each step returns at once) enqueued up front with
  DBOSClient on a queue registered with worker_concurrency=10 and
  polling_interval_sec=0.01, drained by one launched DBOS process. Rate: N over the
  first `started_at_epoch_ms` to the last `updated_at` of its workflow_status rows.
- ours (benchmarks/throughput.py): the same-protocol and reference pgbench ceilings,
  the batched pgbench ceiling (batched_protocol.py: --batched, the product's
  one-at-a-time script and k executions per statement on the same data), idle
  acceptance-to-start, and backlogs of one and of two no-op actions per transition
  (one process, concurrency 10), plus one-action backlogs with more processes
  (--processes). Rate: N over the first start to the last finish.

Each side drains a backlog that was in place before its worker started; worker CPU is
the worker process's own (start-up included), backend CPU that of the server's backends
connected to the side's database, and their sum, per job; WAL is the server's insert
position's advance over the drain, per job (every database's writes count, so nothing
else should run on the server); for our runs, the HOT updates of each table updated.
Then the targets of this round, met or not met; `--runs 3` repeats the side-by-side
part three times (the pgbench ceilings once) and judges the targets on the median of
the three, printing all three. Nothing of the peers is kept in the repository: their
runners below are written into the throwaway environment.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import batched_protocol  # noqa: E402
import throughput  # noqa: E402  (also puts the repository on sys.path)

PGQUEUER = "pgqueuer[asyncpg]==1.6.0"
DBOS = "dbos==3.4.0"

# Runs inside the throwaway environment: `setup DSN N` installs the schema and enqueues,
# `drain DSN N` runs one worker until the queue is empty and prints its rate as JSON.
PGQUEUER_RUNNER = """
import asyncio, json, sys, time
from datetime import timedelta

import asyncpg
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.queries import Queries

mode, dsn, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


async def setup() -> None:
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    for start in range(0, n, 5000):
        k = min(5000, n - start)
        await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    await conn.execute("VACUUM ANALYZE pgqueuer")
    await conn.close()


async def drain() -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop", concurrency_limit=10)
    async def noop(job) -> None:
        return None

    # Log aggregation (folding the log into statistics every 30 s) is switched off so
    # that the log rows the rate is read from stay in place; it runs once per 30 s.
    await qm.run(mode=QueueExecutionMode.drain, batch_size=10,
                 log_aggregation_interval=timedelta(0))
    first, last, done = await conn.fetchrow(
        "SELECT min(created) FILTER (WHERE status = 'picked'), "
        "max(created) FILTER (WHERE status = 'successful'), "
        "count(*) FILTER (WHERE status = 'successful') FROM pgqueuer_log")
    await conn.close()
    seconds = (last - first).total_seconds()
    print(json.dumps({"done": done, "seconds": seconds, "rate": done / seconds}))


asyncio.run(setup() if mode == "setup" else drain())
"""

DBOS_RUNNER = """
import json, sys, time

import sqlalchemy as sa
from dbos import DBOS, DBOSClient

mode, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


@DBOS.step()
def first(i: int) -> int:
    return i


@DBOS.step()
def second(i: int) -> int:
    return i + 1


@DBOS.workflow(name="two_steps")
def two_steps(i: int) -> int:
    return second(first(i))


DBOS(config={"name": "bench", "system_database_url": url, "log_level": "WARNING"})
DBOS.launch()
DBOS.register_queue("bench", worker_concurrency=10, polling_interval_sec=0.01)
if mode == "setup":
    DBOS.destroy()
    client = DBOSClient(system_database_url=url)
    for i in range(n):
        client.enqueue({"queue_name": "bench", "workflow_name": "two_steps"}, i)
    client.destroy()
else:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1),
                              poolclass=sa.pool.NullPool)
    status = sa.text("SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
                     "min(started_at_epoch_ms), max(updated_at) FROM dbos.workflow_status")
    deadline = time.monotonic() + max(300, n / 5)
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            done, first_ms, last_ms = conn.execute(status).one()
        if done >= n:
            break
        time.sleep(0.2)
    DBOS.destroy()
    with engine.connect() as conn:
        steps = conn.execute(sa.text("SELECT count(*) FROM dbos.operation_outputs")).scalar()
    seconds = (last_ms - first_ms) / 1000
    print(json.dumps({"done": done, "steps": steps, "seconds": seconds, "rate": done / seconds}))
"""


def make_venv(folder: Path) -> Path:
    """A virtual environment with the peers installed; its python."""
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", PGQUEUER, DBOS],
            check=True,
        )
    return python


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_peer(python: Path, runner: Path, dsn: str, n: int, name: str) -> dict:
    """Set up (install + enqueue) and drain one peer on a fresh database of its own."""
    database = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{database}"')
    target = throughput.libpq(throughput.with_database(dsn, database))
    try:
        subprocess.run([str(python), str(runner), "setup", target, str(n)], check=True)
        cpu_before, server_before = children_cpu(), throughput.server_cpu_seconds()
        wal_before = throughput.wal_position(dsn)
        backends = throughput.BackendCpu(database).start()
        done = subprocess.run(
            [str(python), str(runner), "drain", target, str(n)],
            check=True,
            capture_output=True,
            text=True,
        )
        worker_cpu = children_cpu() - cpu_before
        server_cpu = throughput.server_cpu_seconds() - server_before
        backend_cpu = backends.stop()
        wal = throughput.wal_position(dsn) - wal_before
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["done"] != n:
            raise RuntimeError(f"{name}: {result['done']} of {n} jobs done")
        return {
            **result,
            "n": n,
            "worker_cpu_ms_per_job": round(1000 * worker_cpu / n, 3),
            "server_cpu_ms_per_job": round(1000 * server_cpu / n, 3),
            "backend_cpu_ms_per_job": round(1000 * backend_cpu / n, 3),
            "cpu_ms_per_job": round(1000 * (worker_cpu + backend_cpu) / n, 3),
            # Every database's WAL over the drain (start-up and the peer's own polling
            # included), per job.
            "wal_bytes_per_job": round(wal / n),
        }
    finally:
        throughput.admin(dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# The targets of this round (issue "the lean protocol"): what each is read from, the
# bound and whether a larger value is better. A KB is 1,024 bytes.
TARGETS: list[tuple[str, str, float, bool]] = [
    ("one action, one process, concurrency 10: >= 1.0x PgQueuer", "pgqueuer_ratio", 1.0, True),
    ("two actions: >= 10x DBOS", "dbos_ratio", 10.0, True),
    ("CPU per one-action execution, worker and its backends: <= 0.7 ms", "cpu_ms", 0.7, False),
    ("WAL per one-action execution: <= 1.5 KB (1,536 bytes)", "wal_bytes", 1536, False),
    ("idle acceptance to start p50: < 5 ms", "idle_p50_ms", 5.0, False),
    ("peak RSS of a worker: < 150 MB", "rss_mb", 150.0, False),
]


def measure(args: argparse.Namespace, dsn: str, python: Path, folder: Path, ceilings: bool) -> dict:
    """One side-by-side run: the peers, our backlogs and (with `ceilings`) the pgbench
    ceilings. Returns everything measured."""
    found: dict = {"load_average_at_start": load_average()}
    if ceilings:
        timing = (args.baseline_seconds, args.baseline_runs, 10)
        found["same"] = throughput.same_protocol_baseline(dsn, *timing, 60_000)
        print(f"same-protocol pgbench ceiling: {found['same']:.0f}/s", flush=True)
        found["reference"] = throughput.reference_baseline(dsn, *timing, HERE / "reference")
        print(f"reference pgbench ceiling: {found['reference']:.0f}/s", flush=True)
        found["batched"] = []
        if args.batched:
            shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.batched.split(",")]
            found["batched"] = batched_protocol.batched_rates(dsn, shapes, *timing[:2], 100_000)
            print("batched pgbench ceiling:", json.dumps(found["batched"]), flush=True)
    found["pgq"] = run_peer(python, folder / "pgqueuer_runner.py", dsn, args.pgqueuer_n, "pgqueuer")
    print("pgqueuer:", json.dumps(found["pgq"]), flush=True)
    ours: dict[str, dict] = {}
    for actions, processes in [(1, 1), (2, 1)] + [
        (1, int(p)) for p in args.processes.split(",") if p and int(p) != 1
    ]:
        run = throughput.run_backlog(dsn, args.n, actions, processes, 10, 10)
        ours[f"{actions}x{processes}"] = run
        print("ours:", json.dumps(run), flush=True)
    found["ours"] = ours
    found["dbos"] = run_peer(python, folder / "dbos_runner.py", dsn, args.dbos_n, "dbos")
    print("dbos:", json.dumps(found["dbos"]), flush=True)
    found["idle"] = (
        throughput.run_idle_latency(dsn, args.idle_count, 0.05) if args.idle_count else {}
    )
    if found["idle"]:
        print("idle:", json.dumps(found["idle"]), flush=True)
    found["load_average_at_end"] = load_average()
    return found


def target_values(found: dict) -> dict[str, float | None]:
    """The value of each target measured in one run (None when it was not run)."""
    one, two, idle = found["ours"]["1x1"], found["ours"]["2x1"], found["idle"]
    peaks = [peak for run in found["ours"].values() for peak in run["peak_rss_mb"]]
    return {
        "pgqueuer_ratio": one["rate"] / found["pgq"]["rate"],
        "dbos_ratio": two["rate"] / found["dbos"]["rate"],
        "cpu_ms": one["cpu_ms_per_execution"],
        "wal_bytes": one["wal_bytes_per_execution"],
        "idle_p50_ms": idle["p50_ms"] if idle else None,
        "rss_mb": max(peaks + (idle["peak_rss_mb"] if idle else [])),
    }


def show(key: str, value: float | None) -> str:
    if value is None:
        return "not run"
    if key.endswith("_ratio"):
        return f"{value:.2f}x"
    if key == "wal_bytes":
        return f"{value:,.0f} B"
    return f"{value:.2f} ms" if key.endswith("_ms") else f"{value:.0f} MB"


def met(key: str, value: float | None, bound: float, larger: bool) -> str:
    if value is None:
        return "not run"
    if key in ("idle_p50_ms", "rss_mb"):
        return "met" if value < bound else "not met"
    return "met" if (value >= bound if larger else value <= bound) else "not met"


def scale_out(found: dict) -> dict[int, float]:
    return {run["processes"]: run["rate"] for key, run in found["ours"].items() if key[0] == "1"}


def run_table(found: dict, ceilings: dict) -> str:
    """The measurements of one run (the pgbench ceilings from the run that measured them)."""
    pgq, dbos, one, two = found["pgq"], found["dbos"], found["ours"]["1x1"], found["ours"]["2x1"]
    same = ceilings["same"]

    def cpu(run: dict) -> str:
        return (
            f"{run['worker_cpu_ms_per_execution']:.2f} / {run['backend_cpu_ms_per_execution']:.2f}"
            f" / {run['cpu_ms_per_execution']:.2f}"
        )

    def peer_cpu(run: dict) -> str:
        return (
            f"{run['worker_cpu_ms_per_job']:.2f} / {run['backend_cpu_ms_per_job']:.2f} / "
            f"{run['cpu_ms_per_job']:.2f}"
        )

    def hot(run: dict) -> str:
        return ", ".join(f"{name} {u['hot_ratio']:.2f}" for name, u in run["hot_updates"].items())

    rows = [
        (
            "measurement",
            "rate",
            "ratio",
            "CPU ms per job: worker / its backends / both",
            "WAL bytes per job",
            "HOT updates / updates",
        ),
        ("pgbench, our protocol one execution at a time (10 clients)", f"{same:,.0f}/s")
        + ("",) * 4,
        ("pgbench, reference queue ceiling (10 clients)", f"{ceilings['reference']:,.0f}/s")
        + ("",) * 4,
        *(
            (
                f"pgbench, our protocol, {b['k'] or 1} execution(s) per statement "
                f"({b['clients']} clients, with 100,000 finished beside; batched_protocol.py)",
                f"{b['rate']:,.0f}/s",
                f"{b['rate'] / ceilings['batched'][0]['rate']:.2f} of the first such row",
                "",
                "",
                "",
            )
            for b in ceilings["batched"]
        ),
        (
            "PgQueuer 1.6.0, concurrency_limit=10, no-op",
            f"{pgq['rate']:,.0f}/s",
            "",
            peer_cpu(pgq),
            f"{pgq['wal_bytes_per_job']:,}",
            "",
        ),
        (
            "DBOS 3.4.0, two-step workflow, worker_concurrency=10",
            f"{dbos['rate']:,.0f}/s",
            "",
            peer_cpu(dbos),
            f"{dbos['wal_bytes_per_job']:,}",
            "",
        ),
        (
            "ours, 1 action, 1 process, concurrency 10",
            f"{one['rate']:,.0f}/s",
            f"{one['rate'] / pgq['rate']:.2f}x PgQueuer; {one['rate'] / same:.2f} of ceiling",
            cpu(one),
            f"{one['wal_bytes_per_execution']:,}",
            hot(one),
        ),
        (
            "ours, 2 actions, 1 process, concurrency 10",
            f"{two['rate']:,.0f}/s",
            f"{two['rate'] / dbos['rate']:.1f}x DBOS",
            cpu(two),
            f"{two['wal_bytes_per_execution']:,}",
            hot(two),
        ),
    ]
    for key, run in found["ours"].items():
        if key not in ("1x1", "2x1"):
            rows.append(
                (
                    f"ours, 1 action, {run['processes']} processes, concurrency 10 each",
                    f"{run['rate']:,.0f}/s",
                    f"{run['rate'] / pgq['rate']:.2f}x PgQueuer; {run['rate'] / same:.2f} of "
                    "ceiling",
                    cpu(run),
                    f"{run['wal_bytes_per_execution']:,}",
                    hot(run),
                )
            )
    idle = found["idle"]
    if idle:
        rows.append(
            (
                "ours, idle acceptance to start p50 / p99",
                f"{idle['p50_ms']} / {idle['p99_ms']} ms",
                "",
                f"peak RSS {max(idle['peak_rss_mb'] + one['peak_rss_mb'])} MB",
                "",
                "",
            )
        )
    return table(rows)


def targets_table(runs: list[dict]) -> str:
    """Each target per run, and with more than one run their median, met or not met
    (judged on the median)."""
    values = [target_values(found) for found in runs]
    several = len(runs) > 1
    head = ["target", *(f"run {i + 1}" for i in range(len(runs)))]
    head += ["median", "met"] if several else ["met"]
    rows = [tuple(head)]
    for label, key, bound, larger in TARGETS:
        measured = [v[key] for v in values]
        taken = [m for m in measured if m is not None]
        middle = statistics.median(taken) if taken else None
        row = [label, *(show(key, m) for m in measured)]
        row += [show(key, middle)] if several else []
        rows.append((*row, met(key, middle, bound, larger)))
    lines = [scale_out(found) for found in runs]
    counts = sorted({p for line in lines for p in line})
    middle_line = {p: statistics.median(line[p] for line in lines if p in line) for p in counts}

    def line_text(line: dict[int, float]) -> str:
        return " / ".join(f"{line[p]:,.0f}" if p in line else "-" for p in counts) + "/s"

    row = [
        f"scale-out line, 1 action, {' / '.join(str(p) for p in counts)} processes",
        *(line_text(line) for line in lines),
    ]
    row += [line_text(middle_line)] if several else []
    wanted = {1, 2, 4} <= set(counts)
    rows.append((*row, "measured" if wanted else "not measured for 1, 2 and 4 processes"))
    return table(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=20_000, help="our executions per backlog run")
    parser.add_argument("--pgqueuer-n", type=int, default=20_000)
    parser.add_argument("--dbos-n", type=int, default=2_000)
    parser.add_argument(
        "--processes",
        default="2,4",
        help="one-action runs with these worker counts beside the one-process run "
        "(the scale-out line)",
    )
    parser.add_argument(
        "--batched",
        default="10x0,2x10",
        help="pgbench clients x executions per statement of batched_protocol.py (k = 0: "
        "the product's one-at-a-time script on the same data); empty skips",
    )
    parser.add_argument("--baseline-seconds", type=int, default=10)
    parser.add_argument("--baseline-runs", type=int, default=3)
    parser.add_argument("--idle-count", type=int, default=200)
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="side-by-side runs (peers, our backlogs, idle); the pgbench ceilings are "
        "measured in the first only. With more than one, the targets are judged on the "
        "median",
    )
    parser.add_argument(
        "--venv", default="", help="keep (and reuse) the peers' environment in this folder"
    )
    args = parser.parse_args()
    dsn = args.dsn

    folder = Path(args.venv) if args.venv else Path(tempfile.mkdtemp(prefix="orq-peers-"))
    runs: list[dict] = []
    try:
        python = make_venv(folder / "venv")
        (folder / "pgqueuer_runner.py").write_text(PGQUEUER_RUNNER)
        (folder / "dbos_runner.py").write_text(DBOS_RUNNER)

        info = throughput.machine_info(dsn)
        print("machine:", json.dumps(info), flush=True)
        for i in range(args.runs):
            print(f"run {i + 1} of {args.runs}", flush=True)
            runs.append(measure(args, dsn, python, folder, ceilings=i == 0))
    finally:
        if not args.venv:
            shutil.rmtree(folder, ignore_errors=True)

    print()
    print(
        f"Machine: {info['cpu']}, {info['cores']} cores, PostgreSQL {info['postgresql']}, "
        f"fsync {info['fsync']}, synchronous_commit {info['synchronous_commit']}, "
        f"Python {info['python']}. N: ours {args.n:,}, PgQueuer {args.pgqueuer_n:,}, DBOS "
        f"{args.dbos_n:,}. WAL is the server's over each drain, other databases' writes "
        "included (nothing else should run); CPU of the worker processes and of their "
        "database's backends; HOT updates per table of our run's database."
    )
    for i, found in enumerate(runs):
        print()
        print(
            f"Run {i + 1}: load average {found['load_average_at_start']} at start, "
            f"{found['load_average_at_end']} at end"
            + ("" if i == 0 else " (pgbench ceilings from run 1)")
        )
        print()
        print(run_table(found, runs[0]))
    print()
    print(targets_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
