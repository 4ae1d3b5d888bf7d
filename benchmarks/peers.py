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
the worker process's own (start-up included), server CPU that of every PostgreSQL
process on this machine over the drain, per job. Nothing of the peers is kept in the
repository: their runners below are written into the throwaway environment.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
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
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["done"] != n:
            raise RuntimeError(f"{name}: {result['done']} of {n} jobs done")
        return {
            **result,
            "n": n,
            "worker_cpu_ms_per_job": round(1000 * worker_cpu / n, 3),
            "server_cpu_ms_per_job": round(1000 * server_cpu / n, 3),
            "backend_cpu_ms_per_job": round(1000 * backend_cpu / n, 3),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=20_000, help="our executions per backlog run")
    parser.add_argument("--pgqueuer-n", type=int, default=20_000)
    parser.add_argument("--dbos-n", type=int, default=2_000)
    parser.add_argument(
        "--processes", default="4", help="extra one-action runs with these worker counts"
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
        "--venv", default="", help="keep (and reuse) the peers' environment in this folder"
    )
    args = parser.parse_args()
    dsn = args.dsn

    folder = Path(args.venv) if args.venv else Path(tempfile.mkdtemp(prefix="orq-peers-"))
    try:
        python = make_venv(folder / "venv")
        (folder / "pgqueuer_runner.py").write_text(PGQUEUER_RUNNER)
        (folder / "dbos_runner.py").write_text(DBOS_RUNNER)

        info = throughput.machine_info(dsn)
        info["load_average_at_start"] = load_average()
        print("machine:", json.dumps(info), flush=True)
        timing = (args.baseline_seconds, args.baseline_runs, 10)
        same = throughput.same_protocol_baseline(dsn, *timing, 60_000)
        print(f"same-protocol pgbench ceiling: {same:.0f}/s", flush=True)
        reference = throughput.reference_baseline(dsn, *timing, HERE / "reference")
        print(f"reference pgbench ceiling: {reference:.0f}/s", flush=True)
        batched = []
        if args.batched:
            shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.batched.split(",")]
            batched = batched_protocol.batched_rates(dsn, shapes, *timing[:2], 100_000)
            print("batched pgbench ceiling:", json.dumps(batched), flush=True)
        pgq = run_peer(python, folder / "pgqueuer_runner.py", dsn, args.pgqueuer_n, "pgqueuer")
        print("pgqueuer:", json.dumps(pgq), flush=True)
        ours: dict[str, dict] = {}
        for actions, processes in [(1, 1), (2, 1)] + [
            (1, int(p)) for p in args.processes.split(",") if p
        ]:
            run = throughput.run_backlog(dsn, args.n, actions, processes, 10, 10)
            run["worker_cpu_ms_per_job"] = round(1000 * run["worker_cpu_s"] / run["done"], 3)
            ours[f"{actions}x{processes}"] = run
            print("ours:", json.dumps(run), flush=True)
        dbos = run_peer(python, folder / "dbos_runner.py", dsn, args.dbos_n, "dbos")
        print("dbos:", json.dumps(dbos), flush=True)
        idle = throughput.run_idle_latency(dsn, args.idle_count, 0.05) if args.idle_count else {}
        if idle:
            print("idle:", json.dumps(idle), flush=True)
        info["load_average_at_end"] = load_average()
    finally:
        if not args.venv:
            shutil.rmtree(folder, ignore_errors=True)

    one, two = ours["1x1"], ours["2x1"]
    cpu = lambda r: f"{r['worker_cpu_ms_per_job']:.2f} / {r['backend_cpu_ms_per_execution']:.2f}"  # noqa: E731
    rows = [
        ("measurement", "rate", "ratio", "CPU ms per job: worker / its backends"),
        ("pgbench, our protocol one execution at a time (10 clients)", f"{same:,.0f}/s", "", ""),
        ("pgbench, reference queue ceiling (10 clients)", f"{reference:,.0f}/s", "", ""),
        *(
            (
                f"pgbench, our protocol, {b['k'] or 1} execution(s) per statement "
                f"({b['clients']} clients, with 100,000 finished beside; batched_protocol.py)",
                f"{b['rate']:,.0f}/s",
                f"{b['rate'] / batched[0]['rate']:.2f} of the first such row",
                "",
            )
            for b in batched
        ),
        (
            "PgQueuer 1.6.0, concurrency_limit=10, no-op",
            f"{pgq['rate']:,.0f}/s",
            "",
            f"{pgq['worker_cpu_ms_per_job']:.2f} / {pgq['backend_cpu_ms_per_job']:.2f}",
        ),
        (
            "DBOS 3.4.0, two-step workflow, worker_concurrency=10",
            f"{dbos['rate']:,.0f}/s",
            "",
            f"{dbos['worker_cpu_ms_per_job']:.2f} / {dbos['backend_cpu_ms_per_job']:.2f}",
        ),
        (
            "ours, 1 action, 1 process, concurrency 10",
            f"{one['rate']:,.0f}/s",
            f"{one['rate'] / pgq['rate']:.2f}x PgQueuer; {one['rate'] / same:.2f} of ceiling",
            cpu(one),
        ),
        (
            "ours, 2 actions, 1 process, concurrency 10",
            f"{two['rate']:,.0f}/s",
            f"{two['rate'] / dbos['rate']:.1f}x DBOS",
            cpu(two),
        ),
    ]
    for key, run in ours.items():
        if key not in ("1x1", "2x1"):
            rows.append(
                (
                    f"ours, 1 action, {run['processes']} processes, concurrency 10 each",
                    f"{run['rate']:,.0f}/s",
                    f"{run['rate'] / pgq['rate']:.2f}x PgQueuer; {run['rate'] / same:.2f} of "
                    "ceiling",
                    cpu(run),
                )
            )
    if idle:
        rows.append(
            (
                "ours, idle acceptance to start p50 / p99",
                f"{idle['p50_ms']} / {idle['p99_ms']} ms",
                "",
                f"peak RSS {max(idle['peak_rss_mb'] + one['peak_rss_mb'])} MB",
            )
        )
    print()
    print(
        f"Machine: {info['cpu']}, {info['cores']} cores, PostgreSQL {info['postgresql']}, "
        f"fsync {info['fsync']}, synchronous_commit {info['synchronous_commit']}, "
        f"Python {info['python']}; load average {info['load_average_at_start']} at start, "
        f"{info['load_average_at_end']} at end. N: ours {args.n:,}, PgQueuer "
        f"{args.pgqueuer_n:,}, DBOS {args.dbos_n:,}."
    )
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
