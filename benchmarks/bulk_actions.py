"""Bulk actions at scale: 10,000 items finish without a long transaction.

    python benchmarks/bulk_actions.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 10000

On a scratch database (created and dropped; the DSN is a superuser or CREATEDB role):
N requests each busy with a PENDING execution (not due, so no scheduler takes them),
plus N/10 RUNNING ones the cancel must refuse. Through the API (the real app, in
process): the preview, then the bulk cancel's acceptance, each timed. Then --workers
bulk loops (worker.bulk_runner.BulkRunner, each with an engine of its own, as each
worker process has) act on the items until the bulk is DONE. Measured:

- every transaction the loops run, from BEGIN to COMMIT (SQLAlchemy's begin and commit
  events on their engines): how many, the median, p99 and the longest;
- the longest transaction the server saw in this database while the bulk ran, sampled
  from pg_stat_activity (now() - xact_start) every 10 ms by a thread of its own;
- the items per second, and the bulk's own counts at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import Connection, Engine, event, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402

from orquestador.api.app import create_app  # noqa: E402
from orquestador.api.context import EXTENSION_KEY  # noqa: E402
from orquestador.api.tokens import mint_token  # noqa: E402
from orquestador.config import Settings, sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.engine import make_engine  # noqa: E402
from orquestador.worker.bulk_runner import CHUNK_ITEMS, BulkRunner  # noqa: E402

ORG = "bench"
SECRET = "bulk-benchmark-secret-" + "0123456789abcdef" * 3
FLOW = {
    "key": "checkout",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "cart",
    "states": ["cart", "paid"],
    "transitions": [{"id": "pay", "from": ["cart"], "actions": [], "to": "paid"}],
}


def arrange(engine: Engine, flow_id: uuid.UUID, count: int, status: str) -> None:
    """`count` requests, each busy with one execution in `status`, in two statements."""
    with engine.begin() as conn:
        conn.execute(
            text("""
            WITH requests AS (
                INSERT INTO request (org_id, owner_id, flow_id, state, revision, data,
                                     created_by)
                SELECT :org, 'alice', :flow, 'cart', 2, '{}'::jsonb, 'alice'
                FROM generate_series(1, :count)
                RETURNING id
            ), executions AS (
                INSERT INTO execution (request_id, org_id, flow_id, transition_id,
                                       accepted_revision, accepted_state, actor_snapshot,
                                       status, next_attempt_at, lease_owner, lease_expires_at)
                SELECT id, :org, :flow, 'pay', 2, 'cart', '{"sub": "alice"}', :status,
                       now() + interval '1 day',
                       CASE WHEN :status = 'RUNNING' THEN 'another-worker' END,
                       CASE WHEN :status = 'RUNNING' THEN now() + interval '1 hour' END
                FROM requests
                RETURNING id, request_id
            )
            UPDATE request r SET busy_execution_id = e.id
            FROM executions e WHERE e.request_id = r.id
            """),
            {"org": ORG, "flow": flow_id, "count": count, "status": status},
        )


def publish(engine: Engine) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text("""INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                      created_by)
                    VALUES (:org, 'checkout', 1, 'manual', CAST(:definition AS jsonb),
                            '{"type": "object"}', 'bench')
                    RETURNING id"""),
            {"org": ORG, "definition": json.dumps(FLOW)},
        ).scalar_one()


class TransactionClock:
    """BEGIN-to-COMMIT (or ROLLBACK) durations of every transaction on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.started: dict[int, float] = {}
        self.durations: list[float] = []
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "commit", self._end)
        event.listen(engine, "rollback", self._end)

    def _begin(self, conn: Connection) -> None:
        self.started[id(conn)] = time.perf_counter()

    def _end(self, conn: Connection) -> None:
        began = self.started.pop(id(conn), None)
        if began is not None:
            self.durations.append(time.perf_counter() - began)


class LongestTransaction(threading.Thread):
    """The longest open transaction of other sessions on this database, sampled."""

    def __init__(self, engine: Engine, every_seconds: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.every = every_seconds
        self.stopped = threading.Event()
        self.longest = 0.0
        self.samples = 0

    def run(self) -> None:
        sql = text(
            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            while not self.stopped.is_set():
                self.longest = max(self.longest, float(conn.execute(sql).scalar_one()))
                self.samples += 1
                self.stopped.wait(self.every)


def summary_ms(durations: list[float]) -> dict[str, float | int]:
    ordered = sorted(durations)
    return {
        "count": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def run(dsn: str, n: int, workers: int, chunk_items: int) -> dict:
    name = f"bench_bulk_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(dsn, name)
    engine = make_engine(target, pool_size=4)
    engines: list[Engine] = []
    app = None
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        flow_id = publish(engine)
        arrange(engine, flow_id, n, "PENDING")
        arrange(engine, flow_id, n // 10, "RUNNING")
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(text("VACUUM ANALYZE"))
        settings = Settings.from_env(
            {}, database_url=target, request_api_enabled=True, jwt_secret=SECRET
        )
        app = create_app(settings)
        client = app.test_client()
        token = mint_token(settings, sub="carol", org=ORG, scopes=["executions:cancel"])
        headers = {"Authorization": f"Bearer {token}"}
        body = {"filter": {"flowId": str(flow_id)}, "action": "cancel", "reason": "benchmark"}

        began = time.perf_counter()
        preview = client.post(
            "/api/v1/executions/bulk", json={**body, "preview": True}, headers=headers
        )
        preview_seconds = time.perf_counter() - began
        assert preview.status_code == 200, preview.get_data(as_text=True)
        began = time.perf_counter()
        accepted = client.post("/api/v1/executions/bulk", json=body, headers=headers)
        accept_seconds = time.perf_counter() - began
        assert accepted.status_code == 202, accepted.get_data(as_text=True)
        bulk_id = accepted.get_json()["bulkId"]

        sampler = LongestTransaction(engine)
        sampler.start()
        clocks, loops = [], []
        for _ in range(workers):
            worker_engine = make_engine(target, pool_size=2)
            engines.append(worker_engine)
            clocks.append(TransactionClock(worker_engine))
            loops.append(
                BulkRunner(
                    worker_engine, claims_budget=10, chunk_items=chunk_items, interval_seconds=0.05
                )
            )
        began = time.perf_counter()
        for loop in loops:
            loop.start()
        while True:
            progress = client.get(f"/api/v1/bulk/{bulk_id}", headers=headers).get_json()
            if progress["status"] == "DONE":
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - began
        for loop in loops:
            loop.stop()
        for loop in loops:
            loop.join(30)
        sampler.stopped.set()
        sampler.join(10)
        transactions = [d for clock in clocks for d in clock.durations]
        return {
            "items": progress["total"],
            "workers": workers,
            "chunk_items": chunk_items,
            "preview": {
                "count": preview.get_json()["count"],
                "ms": round(preview_seconds * 1000, 1),
            },
            "accept_ms": round(accept_seconds * 1000, 1),
            "run_seconds": round(elapsed, 2),
            "items_per_second": round(progress["total"] / elapsed, 1),
            "succeeded": progress["succeeded"],
            "refused": len(progress["refused"]),
            "worker_transactions": summary_ms(transactions),
            "longest_transaction_seen_by_server_ms": round(sampler.longest * 1000, 1),
            "server_samples": sampler.samples,
        }
    finally:
        if app is not None:
            app.extensions[EXTENSION_KEY].engine.dispose()
        for worker_engine in engines:
            worker_engine.dispose()
        engine.dispose()
        throughput.admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("ORQUESTADOR_TEST_DATABASE_URL", ""),
        help="a superuser (or CREATEDB) connection (default: ORQUESTADOR_TEST_DATABASE_URL)",
    )
    parser.add_argument("-n", type=int, default=10_000, help="executions to cancel")
    parser.add_argument("--workers", type=int, default=2, help="bulk loops, one engine each")
    parser.add_argument("--chunk", type=int, default=CHUNK_ITEMS, help="items per round")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or ORQUESTADOR_TEST_DATABASE_URL) is required")
    dsn = sqlalchemy_url(args.dsn).render_as_string(hide_password=False)
    machine = {**throughput.machine_info(dsn), "load_average_1m_before": os.getloadavg()[0]}
    print(json.dumps({"machine": machine}, indent=2))
    result = run(dsn, args.n, args.workers, args.chunk)
    # The machine may be shared: how busy it was says how far to trust the figures.
    result["load_average_1m_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    print(
        f"{result['items']} items in {result['run_seconds']} s "
        f"({result['items_per_second']}/s); longest worker transaction "
        f"{result['worker_transactions']['max_ms']} ms, longest seen by the server "
        f"{result['longest_transaction_seen_by_server_ms']} ms"
    )


if __name__ == "__main__":
    main()
