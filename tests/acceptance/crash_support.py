"""Worker processes for the crash tests, and the ledger their adapter modules append to.

Each crash test's adapter module (crash_adapters, wait_adapters, key_adapters) appends
one JSON line per event to CRASH_LEDGER, tagged with CRASH_ROLE: the test tells the
victim it kills with SIGKILL from the survivors that finish its work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[2]


def spawn_worker(
    database: Any,
    adapters: str,
    ledger: Path,
    role: str,
    *,
    env: dict[str, str] | None = None,
    **settings: int,
) -> subprocess.Popen:
    """`orquestador worker` on the test database with ADAPTER_MODULES=adapters; `settings`
    override the WORKER_* defaults below (lease_seconds=3 sets WORKER_LEASE_SECONDS), and
    `env` adds what the adapter module reads."""
    worker = {
        "lease_seconds": 20,
        "renew_seconds": 5,
        "concurrency": 4,
        "poll_ms": 100,
        "drain_seconds": 5,
        **settings,
    }
    worker.setdefault("batch", worker["concurrency"])
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORKER_ENABLED": "true",
        "DATABASE_URL": database.runtime_dsn,
        **{f"WORKER_{name.upper()}": str(value) for name, value in worker.items()},
        "ADAPTER_MODULES": adapters,
        "CRASH_LEDGER": str(ledger),
        "CRASH_ROLE": role,
        "LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    return subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=environ)


def read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def blocked_inserting_into(conn: Any, table: str) -> bool:
    """Whether one session waits for a lock to insert into `table` (a held victim)."""
    count = conn.execute(
        text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE :insert"
        ),
        {"insert": f"INSERT INTO {table}%"},
    ).scalar_one()
    conn.rollback()  # pg_stat_activity is read once per transaction
    return count == 1
