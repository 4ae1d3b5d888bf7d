"""Worker throughput against pure-SQL ceilings, on the same server, in the same run.

    python benchmarks/throughput.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 20000

Two ceilings, both run with pgbench: the same-protocol baseline (the worker's own
statements, generated from orquestador/queue by protocol_script.py, on the migrated
schema filled by baseline_setup.sql) and the reference queue baseline (the reference
scripts in benchmarks/reference, or --reference-dir). The worker's rate is printed as
a fraction of each. See docs/PERFORMANCE.md.

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
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.schema import EXECUTION_READY_CHANNEL  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import protocol_script  # noqa: E402


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


def pgbench_rate(target: str, seconds: int, clients: int, script: Path, extra: list[str]) -> float:
    """One pgbench run; jobs/s (one script pass = one job). Fails if a client aborted."""
    done = subprocess.run(
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
            *extra,
            "-f",
            str(script),
            target,
        ],
        capture_output=True,
        text=True,
        # JIT off, as every connection of the product (db/engine.py): the claim's estimated
        # cost passes jit_above_cost, and compiling it costs more than running it.
        env={**os.environ, "PGOPTIONS": "-c jit=off"},
    )
    if done.returncode != 0:  # 2: a client aborted (an error, or the claim found nothing)
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr[-2000:]}")
    return float(re.search(r"tps = ([0-9.]+)", done.stdout).group(1))


def psql_file(target: str, sql_file: Path, **variables: str) -> None:
    psql = shutil.which("psql") or str(Path(find_pgbench()).with_name("psql"))
    options = [arg for name, value in variables.items() for arg in ("-v", f"{name}={value}")]
    subprocess.run(
        [psql, "-q", "-v", "ON_ERROR_STOP=1", *options, "-d", target, "-f", str(sql_file)],
        check=True,
        capture_output=True,
    )


def same_protocol_baseline(dsn: str, seconds: int, runs: int, clients: int, rows: int) -> float:
    """Median jobs/s of pgbench running our statements, generated from orquestador/queue,
    on our migrated schema (see protocol_script.py and baseline_setup.sql)."""
    name = f"bench_protocol_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    url = with_database(dsn, name)
    target = libpq(url)
    rates = []
    try:
        migrate.upgrade(migrate.alembic_config(url=url, runtime_role=None))
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "protocol.pgb"
            script.write_text(protocol_script.script())  # from the statements as they are now
            definition = json.dumps(protocol_script.flow_definition())
            for _ in range(runs):
                psql_file(
                    target, HERE / "baseline_setup.sql", nrows=str(rows), definition=definition
                )
                rates.append(
                    pgbench_rate(
                        target, seconds, clients, script, protocol_script.pgbench_defines()
                    )
                )
    finally:
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return statistics.median(rates)


def reference_baseline(dsn: str, seconds: int, runs: int, clients: int, folder: Path) -> float:
    """Median jobs/s of the reference queue script (jobs + checkpoints tables of its own)."""
    name = f"bench_reference_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = libpq(with_database(dsn, name))
    rates = []
    try:
        for _ in range(runs):
            psql_file(target, folder / "queue_schema.sql", nrows="200000")
            rates.append(
                pgbench_rate(target, seconds, clients, folder / "queue_full_protocol.pgb", [])
            )
    finally:
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return statistics.median(rates)


# --- the product ----------------------------------------------------------------


def accept_backlog(engine, flow_id, n: int, org: str = "bench") -> None:
    """N accepted executions at once, as the API would leave them (PENDING, request busy)."""
    with engine.begin() as conn:
        conn.execute(
            text("""
            WITH r AS (
                INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, created_by)
                SELECT :org, 'bench', :flow, 'new', 2, '{}'::jsonb, 'bench'
                FROM generate_series(1, :n) RETURNING id)
            INSERT INTO execution (request_id, org_id, flow_id, transition_id, accepted_revision,
                                   accepted_state, actor_snapshot)
            SELECT id, :org, :flow, 'go', 2, 'new', '{"sub": "bench"}'::jsonb FROM r"""),
            {"flow": flow_id, "n": n, "org": org},
        )
        conn.execute(
            text("""UPDATE request r SET busy_execution_id = e.id FROM execution e
                             WHERE e.request_id = r.id AND r.busy_execution_id IS NULL""")
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE execution"))


def accept_one(engine, flow_id, org: str = "bench") -> None:
    with engine.begin() as conn:
        rid = conn.execute(
            text("""INSERT INTO request (org_id, owner_id, flow_id, state, revision,
                                       data, created_by)
                                   VALUES (:org, 'bench', :flow, 'new', 2, '{}', 'bench')
                                   RETURNING id"""),
            {"flow": flow_id, "org": org},
        ).scalar_one()
        eid = conn.execute(
            text("""INSERT INTO execution (request_id, org_id, flow_id,
                                       transition_id, accepted_revision, accepted_state,
                                       actor_snapshot)
                                   VALUES (:rid, :org, :flow, 'go', 2, 'new', '{}')
                                   RETURNING id"""),
            {"rid": rid, "flow": flow_id, "org": org},
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


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU time of a process so far (0 if it is gone); with
    `reaped_children`, plus that of its children that have ended and been waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_processes(postmaster: int | None = None) -> list[int]:
    """Pids of the PostgreSQL processes on this machine, or of one server's postmaster
    and its children."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text_ = stat.read_text()
        except OSError:
            continue
        if text_[text_.index("(") + 1 : text_.rindex(")")] != "postgres":
            continue
        pid = int(stat.parent.name)
        parent = int(text_.rsplit(")", 1)[1].split()[1])
        if postmaster is None or postmaster in (pid, parent):
            found.append(pid)
    return found


def server_cpu_seconds(postmaster: int | None = None) -> float:
    """CPU time of every PostgreSQL process on this machine (the server is local), or of
    one server's: the live ones, and through the postmaster's reaped children also the
    backends that have ended (a peer's connections close before its CPU can be read)."""
    return sum(cpu_seconds(pid, reaped_children=True) for pid in postgres_processes(postmaster))


class BackendCpu:
    """CPU time of the server's backends connected to one database, sampled while they
    live (a backend's time is lost to this count once it exits, so it is read every
    `interval` seconds and its last reading kept). Other databases' work on a shared
    server is left out; the server's background processes (WAL writer, checkpointer)
    are too."""

    def __init__(self, database: str, interval: float = 0.2) -> None:
        self._pattern = re.compile(rf"^postgres: .*\b{re.escape(database)} ")
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, first: bool) -> None:
        for pid in postgres_processes():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if self._pattern.match(title):
                used = cpu_seconds(pid)
                if first:
                    self._first[pid] = used
                if used:
                    self._last[pid] = used

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample(first=False)

    def start(self) -> BackendCpu:
        self._sample(first=True)
        self._thread.start()
        return self

    def stop(self) -> float:
        """Seconds of CPU since start()."""
        self._stop.set()
        self._thread.join()
        self._sample(first=False)
        return sum(used - self._first.get(pid, 0.0) for pid, used in self._last.items())


def wal_position(dsn: str) -> int:
    """The server's current WAL insert position, in bytes from 0/0. The difference of two
    readings is the WAL every database of the server wrote in between (and the server's
    own background records): not only the run's."""
    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
                ).scalar_one()
            )
    finally:
        engine.dispose()


_TABLE_UPDATES = text(
    """SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
       WHERE schemaname = 'public'"""
)
_OTHER_BACKENDS = text(
    """SELECT count(*) FROM pg_stat_activity
       WHERE datname = current_database() AND pid <> pg_backend_pid()
         AND backend_type = 'client backend'"""
)


def table_updates(engine, timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """Each table's (updates, HOT updates) counted so far. A backend reports its counts
    when it is idle for a while or exits, so this waits until no other client is
    connected to the database (the workers stopped, the set-up's connections closed)."""
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while conn.execute(_OTHER_BACKENDS).scalar() and time.monotonic() < deadline:
            conn.rollback()
            time.sleep(0.1)
        conn.rollback()
        return {name: (int(upd), int(hot)) for name, upd, hot in conn.execute(_TABLE_UPDATES)}


def hot_updates(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict:
    """Per table updated in between: its updates, how many were HOT (no new index
    entries, the new version on the same page) and their ratio."""
    found = {}
    for name, (upd, hot) in sorted(after.items()):
        upd -= before.get(name, (0, 0))[0]
        hot -= before.get(name, (0, 0))[1]
        if upd > 0:
            found[name] = {"updates": upd, "hot": hot, "hot_ratio": round(hot / upd, 3)}
    return found


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


_WORK_LEFT = text(
    """SELECT EXISTS (SELECT 1 FROM execution WHERE status IN ('PENDING', 'RETRY_WAIT'))
           OR EXISTS (SELECT 1 FROM execution WHERE status = 'RUNNING')"""
)


# Where an execution's time goes, from the database's own timestamps: the claim
# (`execution.started_at`), the first RUNNING checkpoint committed, the last step's
# SUCCEEDED, the finish. Medians, in ms; and the mean claim-to-finish, from which the
# slots busy on average follow (rate x mean, per process).
_PHASES = text(
    """WITH steps AS (
           SELECT e.id, e.started_at, e.finished_at,
                  min(a.started_at) AS first_running, max(a.finished_at) AS last_succeeded
           FROM execution e JOIN action_execution a ON a.execution_id = e.id
           WHERE e.status = 'SUCCEEDED'
           GROUP BY e.id
       )
       SELECT percentile_cont(0.5) WITHIN GROUP (
                  ORDER BY extract(epoch FROM first_running - started_at)) * 1000,
              percentile_cont(0.5) WITHIN GROUP (
                  ORDER BY extract(epoch FROM finished_at - first_running)) * 1000,
              avg(extract(epoch FROM finished_at - started_at)) * 1000
       FROM steps"""
)


_IN_PLAY = text(
    """
    UPDATE execution
    SET org_id = 'bench-' || (abs(hashtext(id::text)) % 10),
        priority = abs(hashtext(id::text || 'p')) % 10,
        concurrency_key = id::text,
        concurrency_limit = 1
    """
)


def run_backlog(
    dsn: str,
    n: int,
    actions: int,
    processes: int,
    concurrency: int,
    batch: int,
    *,
    postmaster: int | None = None,
    on_ready: Callable[[str], object] | None = None,
    on_drained: Callable[[str], object] | None = None,
    in_play: bool = False,
) -> dict:
    """Drain N accepted executions with `processes` workers. `on_ready(dsn)` runs once
    the backlog is in place, right before the workers start; `on_drained(dsn)` once it is
    drained, while the (idle) workers still run. `postmaster` limits the server
    CPU figure to that server's processes. `in_play` spreads the backlog over ten
    organizations and the ten priorities and gives each execution a concurrency key of
    its own (limit 1): what the fair claim and the keys cost when nothing waits."""
    name = f"bench_worker_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = with_database(dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
    workers: list = []
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        definition = protocol_script.flow_definition(actions)
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
        if in_play:
            with engine.begin() as conn:
                conn.execute(_IN_PLAY)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE execution"))
        if on_ready is not None:
            on_ready(target)
        updates_before = table_updates(engine)
        wal_before = wal_position(target)
        server_before = server_cpu_seconds(postmaster)
        backends = BackendCpu(name).start()
        workers = spawn_workers(target, processes, concurrency, batch)
        deadline = time.monotonic() + max(120, n / 50)
        # Cheap while the workers run (each partial index answers from its first live
        # entry): counting the table twice a second cost the server about 0.1 ms per
        # execution at N = 20,000, which the server CPU figure then included.
        while time.monotonic() < deadline:
            time.sleep(0.5)
            with engine.connect() as conn:
                if not conn.execute(_WORK_LEFT).scalar():
                    break
        with engine.connect() as conn:
            done = conn.execute(
                text("SELECT count(*) FROM execution WHERE status = 'SUCCEEDED'")
            ).scalar()
        worker_cpu = sum(cpu_seconds(p.pid) for p in workers)
        server_cpu = server_cpu_seconds(postmaster) - server_before
        backend_cpu = backends.stop()
        wal = wal_position(target) - wal_before
        if on_drained is not None:
            on_drained(target)
        peaks = stop_workers(workers)
        updates = hot_updates(updates_before, table_updates(engine))
        with engine.connect() as conn:
            first, last, failed = conn.execute(
                text(
                    "SELECT min(started_at), max(finished_at), "
                    "count(*) FILTER (WHERE status <> 'SUCCEEDED') FROM execution"
                )
            ).one()
        lat = latencies_ms(engine)
        with engine.connect() as conn:
            to_running, running_to_finish, mean_claim_to_finish = conn.execute(_PHASES).one()
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
            "phases_ms": {
                "claim_to_first_running_p50": round(float(to_running), 2),
                "first_running_to_finish_p50": round(float(running_to_finish), 2),
                "claim_to_finish_mean": round(float(mean_claim_to_finish), 2),
                "busy_slots_per_process": round(
                    done / elapsed * float(mean_claim_to_finish) / 1000 / processes, 1
                ),
            },
            "peak_rss_mb": [round(p, 1) for p in peaks],
            # Includes start-up (imports, pool) and the drain; the server figure counts
            # every PostgreSQL process alive at the end, so other load on it shows up too.
            "worker_cpu_s": round(worker_cpu, 2),
            "worker_cpu_ms_per_execution": round(1000 * worker_cpu / max(done, 1), 3),
            "server_cpu_ms_per_execution": round(1000 * server_cpu / max(done, 1), 3),
            # Only the backends of this run's database: what the run itself cost the server.
            "backend_cpu_ms_per_execution": round(1000 * backend_cpu / max(done, 1), 3),
            # The workers and their backends together.
            "cpu_ms_per_execution": round(1000 * (worker_cpu + backend_cpu) / max(done, 1), 3),
            # Every database's WAL over the drain (the server is shared), per execution.
            "wal_bytes_per_execution": round(wal / max(done, 1)),
            "hot_updates": updates,
        }
    finally:
        # A failure before the workers were stopped (a hook's) must not leave them running.
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
                worker.wait(60)
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
        definition = protocol_script.flow_definition(1)
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
        # Accepted through a pooled connection, as the API accepts: a new connection per
        # acceptance would time its fresh backend's first statements (cold caches, a few
        # milliseconds on a small machine), which `created_at` (the transaction's start)
        # then counts as waiting for the worker.
        api = create_engine(sqlalchemy_url(target), pool_size=1, max_overflow=0)
        try:
            for _ in range(count):
                accept_one(api, flow_id)
                time.sleep(gap)
        finally:
            api.dispose()
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


def sleep_flow(seconds: float) -> dict[str, object]:
    """The benchmark flow with its one action a `bench.sleep` call of `seconds`."""
    definition = protocol_script.flow_definition(1)
    (action,) = definition["transitions"][0]["actions"]  # type: ignore[index]
    action.update(capability="bench.sleep", input={"seconds": {"const": seconds}})
    return {**definition, "key": "bench-sleep"}


_ORG_WORK_LEFT = text(
    """SELECT EXISTS (SELECT 1 FROM execution
                      WHERE org_id = :org AND status IN ('PENDING', 'RETRY_WAIT', 'RUNNING'))"""
)
_ORG_PENDING = text(
    """SELECT EXISTS (SELECT 1 FROM execution
                      WHERE org_id = :org AND status IN ('PENDING', 'RETRY_WAIT'))"""
)


def run_skewed(
    dsn: str, backlog: int, seconds: float, every: float, processes: int, concurrency: int
) -> dict:
    """One organization's backlog of `backlog` slow executions (`seconds` each) and another
    organization's trickle, one execution accepted every `every` seconds while the backlog
    is still waiting to be claimed. The trickle's start latency (acceptance to claim, from
    the database's timestamps) shows how long a small organization waits behind a large one.
    """
    name = f"bench_skewed_{uuid.uuid4().hex[:8]}"
    admin(dsn, f'CREATE DATABASE "{name}"')
    target = with_database(dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
    api = create_engine(sqlalchemy_url(target), pool_size=1, max_overflow=0)
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        definition = sleep_flow(seconds)
        flows = {}
        with engine.begin() as conn:
            for org in ("bulk", "trickle"):
                flows[org] = conn.execute(
                    text(
                        """INSERT INTO flow (org_id, key, version, trigger, definition,
                                         data_schema, created_by)
                       VALUES (:org, :key, 1, 'manual', CAST(:d AS jsonb), '{"type":"object"}',
                               'bench') RETURNING id"""
                    ),
                    {"org": org, "key": definition["key"], "d": json.dumps(definition)},
                ).scalar_one()
        accept_backlog(engine, flows["bulk"], backlog, org="bulk")
        workers = spawn_workers(target, processes, concurrency, 10)
        deadline = time.monotonic() + 120 + backlog * seconds / max(1, concurrency)
        # The trickle starts once the workers claim, so their start-up is not counted.
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(
                    text("SELECT EXISTS (SELECT 1 FROM execution WHERE started_at IS NOT NULL)")
                ).scalar():
                    break
            time.sleep(0.1)
        accepted = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if not conn.execute(_ORG_PENDING, {"org": "bulk"}).scalar():
                    break
            accept_one(api, flows["trickle"], org="trickle")
            accepted += 1
            time.sleep(every)
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if not any(
                    conn.execute(_ORG_WORK_LEFT, {"org": org}).scalar()
                    for org in ("bulk", "trickle")
                ):
                    break
            time.sleep(0.2)
        stop_workers(workers)
        with engine.connect() as conn:
            trickle = [
                float(r[0])
                for r in conn.execute(
                    text(
                        "SELECT extract(epoch FROM started_at - created_at) FROM execution "
                        "WHERE org_id = 'trickle' AND started_at IS NOT NULL"
                    )
                )
            ]
            done, not_succeeded, first, last = conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'), "
                    "count(*) FILTER (WHERE status <> 'SUCCEEDED'), "
                    "min(started_at), max(finished_at) FROM execution WHERE org_id = 'bulk'"
                )
            ).one()
        elapsed = (last - first).total_seconds()
        return {
            "backlog": backlog,
            "adapter_seconds": seconds,
            "processes": processes,
            "concurrency": concurrency,
            "backlog_done": done,
            "backlog_not_succeeded": not_succeeded,
            "backlog_seconds": round(elapsed, 2),
            "backlog_rate": round(done / elapsed, 1),
            "trickle_every_s": every,
            "trickle_accepted": accepted,
            "trickle_started": len(trickle),
            "trickle_start_p50_s": round(percentile(trickle, 0.5), 2) if trickle else None,
            "trickle_start_p99_s": round(percentile(trickle, 0.99), 2) if trickle else None,
            "trickle_start_max_s": round(max(trickle), 2) if trickle else None,
            # Other work on the machine slows the drain; its load goes with the numbers.
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        api.dispose()
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
    parser.add_argument(
        "--baseline-rows",
        type=int,
        default=60_000,
        help="accepted executions set up for each same-protocol pgbench run",
    )
    parser.add_argument("--idle-count", type=int, default=200, help="0 skips the idle run")
    parser.add_argument(
        "--reference-dir",
        default=str(HERE / "reference"),
        help="folder with the reference queue_full_protocol.pgb and queue_schema.sql "
        "(default: the copy in benchmarks/reference); empty to skip",
    )
    parser.add_argument("--skip-same-protocol", action="store_true")
    parser.add_argument(
        "--in-play",
        action="store_true",
        help="also drain each backlog with organizations, priorities and concurrency keys"
        " in play (ten organizations, priorities 0-9, a key per execution)",
    )
    parser.add_argument("--only-baselines", action="store_true")
    parser.add_argument(
        "--skewed",
        action="store_true",
        help="run only the skewed-load line: one organization's backlog, another's trickle",
    )
    parser.add_argument("--skewed-backlog", type=int, default=600, help="backlog executions")
    parser.add_argument(
        "--skewed-seconds", type=float, default=0.5, help="each backlog call's duration"
    )
    parser.add_argument(
        "--skewed-every", type=float, default=1.0, help="seconds between trickle acceptances"
    )
    parser.add_argument("--skewed-processes", type=int, default=1, help="worker processes")
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
        if args.skewed:
            skewed = run_skewed(
                dsn,
                args.skewed_backlog,
                args.skewed_seconds,
                args.skewed_every,
                args.skewed_processes,
                args.concurrency,
            )
            print("skewed:", json.dumps(skewed), flush=True)
            return 0
        clients = args.baseline_clients
        timing = (args.baseline_seconds, args.baseline_runs, clients)
        baselines = {}
        if not args.skip_same_protocol:
            baselines["same_protocol"] = same_protocol_baseline(dsn, *timing, args.baseline_rows)
            print(
                "same-protocol baseline (our statements on our schema, pgbench, "
                f"{clients} clients): {baselines['same_protocol']:.0f} executions/s",
                flush=True,
            )
        if args.reference_dir:
            baselines["reference"] = reference_baseline(dsn, *timing, Path(args.reference_dir))
            print(
                f"reference queue baseline (shared/bench, pgbench, {clients} clients): "
                f"{baselines['reference']:.0f} jobs/s",
                flush=True,
            )
        if args.only_baselines:
            return 0
        if args.idle_count > 0:
            idle = run_idle_latency(dsn, args.idle_count, 0.05)
            print("idle acceptance-to-start:", json.dumps(idle), flush=True)
        for actions in (int(a) for a in args.actions.split(",")):
            for processes in (int(p) for p in args.processes.split(",")):
                for in_play in (False, True) if args.in_play else (False,):
                    result = run_backlog(
                        dsn,
                        args.n,
                        actions,
                        processes,
                        args.concurrency,
                        args.batch,
                        in_play=in_play,
                    )
                    for which, rate in baselines.items():
                        result[f"fraction_of_{which}"] = round(result["rate"] / rate, 3)
                    label = "backlog (organizations, priorities, keys):" if in_play else "backlog:"
                    print(label, json.dumps(result), flush=True)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
