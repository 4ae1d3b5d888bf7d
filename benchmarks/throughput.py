"""Worker throughput against the pure-SQL ceiling of the same protocol, on the same server.

    python benchmarks/throughput.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 20000

The DSN is a superuser (or CREATEDB) connection; scratch databases are created and
dropped. Without --dsn an embedded PostgreSQL (fsync on) is started in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.schema import EXECUTION_READY_CHANNEL  # noqa: E402

HERE = Path(__file__).resolve().parent


def admin(dsn: str, sql: str) -> None:
    engine = create_engine(
        sqlalchemy_url(dsn), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


def with_database(dsn: str, name: str) -> str:
    return make_url(dsn).set(database=name).render_as_string(hide_password=False)


def libpq(dsn: str) -> str:
    return make_url(dsn).set(drivername="postgresql").render_as_string(hide_password=False)


def machine_info(dsn: str) -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    with engine.connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar()
        fsync = conn.execute(text("SHOW fsync")).scalar()
        sync_commit = conn.execute(text("SHOW synchronous_commit")).scalar()
    engine.dispose()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "postgresql": str(version),
        "fsync": str(fsync),
        "synchronous_commit": str(sync_commit),
        "python": platform.python_version(),
    }


# --- pure-SQL baseline ----------------------------------------------------------


def find_pgbench() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    from orquestador.db.embedded import _wheel_package

    return str(_wheel_package() / "pginstall" / "bin" / "pgbench")


def baseline(dsn: str, seconds: int, runs: int, clients: int, script: Path, schema: Path) -> float:
    """Median jobs/s of pgbench running the full protocol (one transaction = one job)."""
    name = f"bench_baseline_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = libpq(with_database(dsn, name))
    psql = shutil.which("psql") or str(Path(find_pgbench()).with_name("psql"))
    rates = []
    try:
        for _ in range(runs):
            subprocess.run(
                [psql, "-q", "-d", target, "-v", "nrows=200000", "-f", str(schema)],
                check=True,
                capture_output=True,
            )
            out = subprocess.run(
                [
                    find_pgbench(),
                    "-n",
                    "-M",
                    "prepared",
                    "-c",
                    str(clients),
                    "-j",
                    "2",
                    "-T",
                    str(seconds),
                    "-f",
                    str(script),
                    target,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rates.append(float(re.search(r"tps = ([0-9.]+)", out).group(1)))
    finally:
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return statistics.median(rates)


# --- the product ----------------------------------------------------------------


def flow(actions: int) -> dict:
    return {
        "key": f"bench-{actions}",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "to": "done",
                "actions": [
                    {
                        "id": f"a{i}",
                        "capability": "bench.noop",
                        "version": 1,
                        "input": {"n": {"const": i}},
                    }
                    for i in range(actions)
                ],
            }
        ],
    }


def accept_backlog(engine, flow_id, n: int) -> None:
    """N accepted executions at once, as the API would leave them (PENDING, request busy)."""
    with engine.begin() as conn:
        conn.execute(
            text("""
            WITH r AS (
                INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, created_by)
                SELECT 'bench', 'bench', :flow, 'new', 2, '{}'::jsonb, 'bench'
                FROM generate_series(1, :n) RETURNING id)
            INSERT INTO execution (request_id, org_id, flow_id, transition_id, accepted_revision,
                                   accepted_state, actor_snapshot)
            SELECT id, 'bench', :flow, 'go', 2, 'new', '{"sub": "bench"}'::jsonb FROM r"""),
            {"flow": flow_id, "n": n},
        )
        conn.execute(
            text("""UPDATE request r SET busy_execution_id = e.id FROM execution e
                             WHERE e.request_id = r.id AND r.busy_execution_id IS NULL""")
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE execution"))


def accept_one(engine, flow_id) -> None:
    with engine.begin() as conn:
        rid = conn.execute(
            text("""INSERT INTO request (org_id, owner_id, flow_id, state, revision,
                                       data, created_by)
                                   VALUES ('bench', 'bench', :flow, 'new', 2, '{}', 'bench')
                                   RETURNING id"""),
            {"flow": flow_id},
        ).scalar_one()
        eid = conn.execute(
            text("""INSERT INTO execution (request_id, org_id, flow_id,
                                       transition_id, accepted_revision, accepted_state,
                                       actor_snapshot)
                                   VALUES (:rid, 'bench', :flow, 'go', 2, 'new', '{}')
                                   RETURNING id"""),
            {"rid": rid, "flow": flow_id},
        ).scalar_one()
        conn.execute(
            text("UPDATE request SET busy_execution_id = :e WHERE id = :r"), {"e": eid, "r": rid}
        )
        conn.execute(
            text("SELECT pg_notify(:c, :p)"), {"c": EXECUTION_READY_CHANNEL, "p": str(eid)}
        )


def spawn_workers(dsn: str, count: int, concurrency: int, batch: int) -> list:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORKER_ENABLED": "true",
        "DATABASE_URL": dsn,
        "WORKER_CONCURRENCY": str(concurrency),
        "WORKER_BATCH": str(batch),
        "WORKER_POLL_MS": "500",
        "ADAPTER_MODULES": "benchmarks.bench_adapters",
        "LOG_LEVEL": "WARNING",
    }
    return [
        subprocess.Popen([sys.executable, "-m", "orquestador.worker"], env=env, cwd=ROOT)
        for _ in range(count)
    ]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop_workers(processes) -> list[float]:
    peaks = [peak_rss_mb(p.pid) for p in processes]
    for p in processes:
        p.terminate()
    for p in processes:
        p.wait(60)
    return peaks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latencies_ms(engine) -> list[float]:
    with engine.connect() as conn:
        return [
            float(r[0])
            for r in conn.execute(
                text(
                    "SELECT extract(epoch FROM started_at - created_at) * 1000 FROM execution "
                    "WHERE started_at IS NOT NULL"
                )
            )
        ]


def run_backlog(
    dsn: str, n: int, actions: int, processes: int, concurrency: int, batch: int
) -> dict:
    name = f"bench_worker_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = with_database(dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        definition = flow(actions)
        with engine.begin() as conn:
            flow_id = conn.execute(
                text(
                    """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                     created_by)
                   VALUES ('bench', :key, 1, 'manual', CAST(:d AS jsonb), '{"type":"object"}',
                           'bench') RETURNING id"""
                ),
                {"key": definition["key"], "d": json.dumps(definition)},
            ).scalar_one()
        accept_backlog(engine, flow_id, n)
        workers = spawn_workers(target, processes, concurrency, batch)
        deadline = time.monotonic() + max(120, n / 50)
        done = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                done = conn.execute(
                    text("SELECT count(*) FROM execution WHERE status = 'SUCCEEDED'")
                ).scalar()
            if done >= n:
                break
            time.sleep(0.5)
        peaks = stop_workers(workers)
        with engine.connect() as conn:
            first, last, failed = conn.execute(
                text(
                    "SELECT min(started_at), max(finished_at), "
                    "count(*) FILTER (WHERE status <> 'SUCCEEDED') FROM execution"
                )
            ).one()
        lat = latencies_ms(engine)
        elapsed = (last - first).total_seconds()
        return {
            "actions": actions,
            "processes": processes,
            "n": n,
            "done": done,
            "not_succeeded": failed,
            "seconds": round(elapsed, 2),
            "rate": round(done / elapsed, 1),
            "p50_ms": round(percentile(lat, 0.5), 1),
            "p99_ms": round(percentile(lat, 0.99), 1),
            "peak_rss_mb": [round(p, 1) for p in peaks],
        }
    finally:
        engine.dispose()
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_idle_latency(dsn: str, count: int, gap: float) -> dict:
    """Acceptance-to-start when the worker is idle: the LISTEN/NOTIFY wake-up path."""
    name = f"bench_idle_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = with_database(dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        definition = flow(1)
        with engine.begin() as conn:
            flow_id = conn.execute(
                text(
                    """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                     created_by)
                   VALUES ('bench', 'idle', 1, 'manual', CAST(:d AS jsonb), '{}', 'bench')
                   RETURNING id"""
                ),
                {"d": json.dumps(definition)},
            ).scalar_one()
        workers = spawn_workers(target, 1, 10, 10)
        time.sleep(3)  # start-up: imports, pool, LISTEN
        for _ in range(count):
            accept_one(engine, flow_id)
            time.sleep(gap)
        time.sleep(1)
        peaks = stop_workers(workers)
        lat = latencies_ms(engine)
        return {
            "count": len(lat),
            "p50_ms": round(percentile(lat, 0.5), 1),
            "p99_ms": round(percentile(lat, 0.99), 1),
            "peak_rss_mb": [round(p, 1) for p in peaks],
        }
    finally:
        engine.dispose()
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DATABASE_URL", ""))
    parser.add_argument("-n", type=int, default=20_000, help="executions per run")
    parser.add_argument("--actions", default="1,3")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--concurrency", type=int, default=10, help="WORKER_CONCURRENCY")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument(
        "--baseline-clients",
        type=int,
        default=10,
        help="pgbench clients; kept apart from --concurrency so the ceiling stays comparable",
    )
    parser.add_argument("--baseline-seconds", type=int, default=10)
    parser.add_argument("--baseline-runs", type=int, default=3)
    parser.add_argument("--idle-count", type=int, default=200)
    parser.add_argument(
        "--reference-dir",
        default="",
        help="folder with another queue_full_protocol.pgb/queue_schema.sql "
        "to check the project's baseline script against",
    )
    args = parser.parse_args()

    server = None
    folder = None
    dsn = args.dsn
    if not dsn:
        from orquestador.db.embedded import EmbeddedPostgres

        folder = Path(tempfile.mkdtemp(prefix="orquestador-bench-"))
        folder.chmod(0o755)
        server = EmbeddedPostgres(folder / "pgdata", fsync=True)
        server.start()
        dsn = server.url("postgres")
    try:
        info = machine_info(dsn)
        print("machine:", json.dumps(info))
        base = baseline(
            dsn,
            args.baseline_seconds,
            args.baseline_runs,
            args.baseline_clients,
            HERE / "baseline_protocol.pgb",
            HERE / "baseline_schema.sql",
        )
        clients = args.baseline_clients
        print(f"baseline (pure SQL, full protocol, {clients} clients): {base:.0f} jobs/s")
        if args.reference_dir:
            ref = Path(args.reference_dir)
            other = baseline(
                dsn,
                args.baseline_seconds,
                args.baseline_runs,
                args.baseline_clients,
                ref / "queue_full_protocol.pgb",
                ref / "queue_schema.sql",
            )
            print(f"reference script: {other:.0f} jobs/s")
        idle = run_idle_latency(dsn, args.idle_count, 0.05)
        print("idle acceptance-to-start:", json.dumps(idle))
        for actions in (int(a) for a in args.actions.split(",")):
            for processes in (int(p) for p in args.processes.split(",")):
                result = run_backlog(dsn, args.n, actions, processes, args.concurrency, args.batch)
                result["fraction_of_baseline"] = round(result["rate"] / base, 3)
                print("backlog:", json.dumps(result), flush=True)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
