"""Durable waits at scale: many executions waiting on machine commands hold no worker thread,
and each resumes within milliseconds of its command's status change.

    python benchmarks/waits.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 1000

On a scratch database (created and dropped; the DSN is a superuser or CREATEDB role),
one in-process worker (WORKER_CONCURRENCY threads) runs N executions of a flow whose
transition sends a command (machine.command@1) and waits for it (machine.wait@1, a
deadline far away). Once every command is written and taken by its agent (sent), all
N executions must be parked WAITING at once, with no lease and no busy worker slot.
Then the agents' final reports arrive at --rate per second, through the same store
function the agent API calls, and each execution's resume latency is measured in the
database's clock: from the report's status change to the end of the wait step, and to
the end of the execution. See docs/MACHINES.md.
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

from sqlalchemy import Engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402

from orquestador.actions import AdapterRegistry  # noqa: E402
from orquestador.actions.builtin import register_builtins  # noqa: E402
from orquestador.config import Settings, sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.engine import make_engine  # noqa: E402
from orquestador.db.schema import EXECUTION_READY_CHANNEL  # noqa: E402
from orquestador.machines import claim_next, report_status  # noqa: E402
from orquestador.worker.daemon import Worker  # noqa: E402

ORG = "bench"
DEADLINE_SECONDS = 3600


def flow() -> dict:
    return {
        "key": "decommission",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "off", "attention"],
        "transitions": [
            {
                "id": "power-off",
                "from": ["new"],
                "actions": [
                    {
                        "id": "send",
                        "capability": "machine.command",
                        "version": 1,
                        "input": {
                            "machineId": {"from": "/data/machineId"},
                            "command": {"const": "poweroff"},
                        },
                        "onError": "attention",
                    },
                    {
                        "id": "wait",
                        "capability": "machine.wait",
                        "version": 1,
                        "input": {
                            "commandId": {"from": "/actions/send/commandId"},
                            "deadlineSeconds": {"const": DEADLINE_SECONDS},
                        },
                        "onError": "attention",
                    },
                ],
                "to": "off",
            }
        ],
    }


def accept(engine: Engine, n: int) -> None:
    """N requests, one per machine, each with its transition accepted (as the API does)."""
    definition = flow()
    with engine.begin() as conn:
        flow_id = conn.execute(
            text(
                """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                     created_by)
                   VALUES (:org, 'decommission', 1, 'manual', CAST(:d AS jsonb),
                           '{"type": "object"}', 'bench') RETURNING id"""
            ),
            {"org": ORG, "d": json.dumps(definition)},
        ).scalar_one()
        conn.execute(
            text(
                """WITH r AS (
                       INSERT INTO request (org_id, owner_id, flow_id, state, revision, data,
                                            created_by, busy_execution_id)
                       SELECT :org, 'bench', :flow, 'new', 2,
                              jsonb_build_object('machineId', 'm-' || i), 'bench',
                              gen_random_uuid()
                       FROM generate_series(1, :n) AS i
                       RETURNING id, busy_execution_id)
                   INSERT INTO execution (id, request_id, org_id, flow_id, transition_id,
                                          accepted_revision, accepted_state, actor_snapshot)
                   SELECT busy_execution_id, id, :org, :flow, 'power-off', 2, 'new',
                          '{"sub": "bench"}'
                   FROM r"""
            ),
            {"org": ORG, "flow": flow_id, "n": n},
        )
        conn.execute(text("SELECT pg_notify(:c, '')"), {"c": EXECUTION_READY_CHANNEL})


def count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def wait_for(engine: Engine, sql: str, target: int, timeout: float, what: str) -> None:
    give_up = time.monotonic() + timeout
    while (found := count(engine, sql)) < target:
        if time.monotonic() > give_up:
            raise SystemExit(f"gave up waiting for {what}: {found} of {target}")
        time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(dsn: str, n: int, rate: float, concurrency: int) -> dict:
    name = f"bench_waits_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(dsn, name)
    engine = make_engine(target, pool_size=4)
    worker = None
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        settings = Settings.from_env(
            {},
            database_url=target,
            worker_concurrency=concurrency,
            worker_batch=concurrency,
        )
        registry = AdapterRegistry()
        register_builtins(registry, settings)
        accept(engine, n)
        worker_engine = make_engine(target, pool_size=concurrency + 2)
        worker = Worker(settings, worker_engine, registry)
        threads_before = threading.active_count()
        started = time.monotonic()
        worker.start()

        # Every command written, then taken by its machine's agent (sent): all parked.
        wait_for(engine, "SELECT count(*) FROM machine_command", n, 600, "the commands")
        with engine.begin() as conn:
            for i in range(1, n + 1):
                claim_next(conn, org_id=ORG, machine_id=f"m-{i}")
        parked_sql = (
            "SELECT count(*) FROM execution WHERE status = 'WAITING' AND lease_owner IS NULL"
            " AND next_attempt_at > clock_timestamp() + interval '2 seconds'"
        )
        wait_for(engine, parked_sql, n, 600, "every execution to park")
        setup_seconds = time.monotonic() - started
        waiting = {
            "waiting": count(engine, "SELECT count(*) FROM execution WHERE status = 'WAITING'"),
            "running": count(engine, "SELECT count(*) FROM execution WHERE status = 'RUNNING'"),
            "busy_worker_slots": worker.slots.busy,
            "worker_slots": concurrency,
            "process_threads": threading.active_count(),
            "process_threads_before_worker": threads_before,
        }

        # The agents' final reports, paced, in their own short transactions.
        with engine.connect() as conn:
            commands = conn.execute(
                text("SELECT id, machine_id FROM machine_command ORDER BY random()")
            ).all()
        report_started = time.monotonic()
        for position, command in enumerate(commands):
            pause = report_started + position / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with engine.begin() as conn:
                report_status(
                    conn,
                    org_id=ORG,
                    machine_id=command.machine_id,
                    command_id=command.id,
                    status="succeeded",
                    exit_code=0,
                )
        wait_for(
            engine,
            "SELECT count(*) FROM execution WHERE status = 'SUCCEEDED'",
            n,
            600,
            "every execution to finish",
        )
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    """SELECT extract(epoch FROM w.finished_at - c.finished_at) * 1000 AS step,
                              extract(epoch FROM e.finished_at - c.finished_at) * 1000 AS done
                       FROM machine_command c
                       JOIN action_execution w
                         ON w.action_id = 'wait'
                        AND w.execution_id = CAST(split_part(c.external_key, ':', 1) AS uuid)
                       JOIN execution e ON e.id = w.execution_id"""
                )
            ).all()
        step = [float(r.step) for r in rows]
        done = [float(r.done) for r in rows]

        def summary(values: list[float]) -> dict:
            return {
                "p50_ms": round(statistics.median(values), 1),
                "p95_ms": round(percentile(values, 0.95), 1),
                "p99_ms": round(percentile(values, 0.99), 1),
                "max_ms": round(max(values), 1),
            }

        return {
            "n": n,
            "report_rate_per_s": rate,
            "setup_seconds": round(setup_seconds, 1),
            "while_waiting": waiting,
            "measured": len(rows),
            "report_to_wait_step_done": summary(step),
            "report_to_execution_done": summary(done),
        }
    finally:
        if worker is not None:
            worker.stop(timeout=60)
            worker.engine.dispose()
        engine.dispose()
        throughput.admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("ORQUESTADOR_TEST_DATABASE_URL", ""),
        help="a superuser (or CREATEDB) connection (default: ORQUESTADOR_TEST_DATABASE_URL)",
    )
    parser.add_argument("-n", type=int, default=1000, help="executions waiting at once")
    parser.add_argument("--rate", type=float, default=50.0, help="final reports per second")
    parser.add_argument("--concurrency", type=int, default=10, help="WORKER_CONCURRENCY")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or ORQUESTADOR_TEST_DATABASE_URL) is required")
    dsn = sqlalchemy_url(args.dsn).render_as_string(hide_password=False)
    machine = {**throughput.machine_info(dsn), "load_average_1m_before": os.getloadavg()[0]}
    print(json.dumps({"machine": machine}, indent=2))
    result = run(dsn, args.n, args.rate, args.concurrency)
    # The machine may be shared: how busy it was says how far to trust the figures.
    result["load_average_1m_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    waiting = result["while_waiting"]
    print(
        f"{args.n} executions WAITING at once with {waiting['busy_worker_slots']} of "
        f"{waiting['worker_slots']} worker slots busy; resume after the status change: "
        f"p50 {result['report_to_wait_step_done']['p50_ms']} ms (wait step done), "
        f"p50 {result['report_to_execution_done']['p50_ms']} ms (execution done)"
    )


if __name__ == "__main__":
    main()
