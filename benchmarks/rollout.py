"""A rollout over 1,000 machines with a no-op child, batch 50: wall time, the parent's CPU
and database statements per child, and no child started after the failure budget is
spent when 10 % of the children fail.

    python benchmarks/rollout.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 1000

On a scratch database (created and dropped; the DSN is a superuser or CREATEDB role), one
in-process worker (WORKER_CONCURRENCY threads) runs a flow whose one step is rollout@1
over N machines (batch 50) of a child flow whose one step is an inline no-op. Two runs:

- all succeed (maxFailures 0): from the parent's acceptance to its end; the CPU time its
  rounds took (thread time inside rollout@1's calls) and the statements they sent, per
  child; the rounds it took.
- every tenth child fails, with a budget of 5 % of the items: the failures when the
  budget was spent, how far above it they ended (at most batch - 1 more than the one that
  spent it), the items skipped, and the children created after the spending failure's
  end (must be 0: both stamped under the rollout row's lock).

Prints JSON with the machine; exit 1 when a child started after the budget was spent.
See docs/ROLLOUTS.md and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402

from orquestador.actions import (  # noqa: E402
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    PermanentError,
)
from orquestador.actions.builtin import register_builtins  # noqa: E402
from orquestador.actions.builtin import rollout as rollout_adapter  # noqa: E402
from orquestador.config import Settings  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.engine import make_engine  # noqa: E402
from orquestador.db.schema import EXECUTION_READY_CHANNEL  # noqa: E402
from orquestador.worker.daemon import Worker  # noqa: E402

ORG = "bench"
BATCH = 50


class ParentMeter:
    """The parent's cost: thread CPU time and statements inside rollout@1's calls."""

    def __init__(self) -> None:
        self.inside = threading.local()
        self.cpu_seconds = 0.0
        self.statements = 0
        self.rounds = 0
        self._lock = threading.Lock()

    def wrap(self, invoke: Any) -> Any:
        def measured(calls: Any, ctx: ActionContext) -> Any:
            self.inside.on = True
            began = time.thread_time()
            try:
                return invoke(calls, ctx)
            finally:
                spent = time.thread_time() - began
                self.inside.on = False
                with self._lock:
                    self.cpu_seconds += spent
                    self.rounds += 1

        return measured

    def count(self, *args: Any) -> None:
        if getattr(self.inside, "on", False):
            with self._lock:
                self.statements += 1


def _noop(failing: frozenset[str]) -> Adapter:
    def invoke(ctx: ActionContext) -> dict[str, Any]:
        if ctx.inputs["machineId"] in failing:
            raise PermanentError("PATCH_FAILED", "rehearsed failure")
        return {}

    return Adapter(
        capability="bench.noop",
        version=1,
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        timeout_seconds=5,
        max_attempts=1,
        invoke=invoke,
        inline=True,
    )


def _flows(max_failures: int | str) -> tuple[dict[str, Any], dict[str, Any]]:
    child = {
        "key": "noop-child",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "actions": [
                    {
                        "id": "noop",
                        "capability": "bench.noop",
                        "version": 1,
                        "input": {"machineId": {"from": "/data/machineId"}},
                    }
                ],
                "to": "done",
            }
        ],
    }
    parent = {
        "key": "roll",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done", "attention"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "actions": [
                    {
                        "id": "roll",
                        "capability": "rollout",
                        "version": 1,
                        "input": {
                            "items": {"from": "/data/machines"},
                            "flow": {"const": "noop-child"},
                            "transition": {"const": "go"},
                            "data": {"const": {"machineId": "{/item}"}},
                            "batch": {"const": BATCH},
                            "maxFailures": {"const": max_failures},
                        },
                        "onError": "attention",
                    }
                ],
                "to": "done",
            }
        ],
    }
    return child, parent


def _publish(conn: Any, definition: dict[str, Any], version: int) -> None:
    conn.execute(
        text(
            """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                 created_by)
               VALUES (:org, :key, :version, 'manual', CAST(:d AS jsonb), '{"type": "object"}',
                       'bench')"""
        ),
        {"org": ORG, "key": definition["key"], "version": version, "d": json.dumps(definition)},
    )


def _accept(engine: Engine, machines: list[str], max_failures: int | str, version: int) -> str:
    child, parent = _flows(max_failures)
    with engine.begin() as conn:
        _publish(conn, child, version)
        _publish(conn, parent, version)
        return str(
            conn.execute(
                text(
                    """WITH f AS (SELECT id FROM flow WHERE org_id = :org AND key = 'roll'
                                  AND version = :version),
                       r AS (INSERT INTO request (org_id, owner_id, flow_id, state, revision,
                                                  data, created_by, busy_execution_id)
                             SELECT :org, 'bench', f.id, 'new', 2, CAST(:data AS jsonb),
                                    'bench', gen_random_uuid() FROM f
                             RETURNING id, flow_id, busy_execution_id)
                       INSERT INTO execution (id, request_id, org_id, flow_id, transition_id,
                                              accepted_revision, accepted_state,
                                              actor_snapshot)
                       SELECT busy_execution_id, id, :org, flow_id, 'go', 2, 'new',
                              '{"sub": "bench"}' FROM r
                       RETURNING id"""
                ),
                {"org": ORG, "version": version, "data": json.dumps({"machines": machines})},
            ).scalar_one()
        )


def _ended(engine: Engine, execution_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, error_code FROM execution WHERE id = :id AND status IN"
                " ('SUCCEEDED', 'FAILED', 'RECONCILIATION_REQUIRED', 'CANCELLED')"
            ),
            {"id": execution_id},
        ).first()


def _one_rollout(
    engine: Engine, meter: ParentMeter, machines: list[str], max_failures: int | str, version: int
) -> dict[str, Any]:
    meter.cpu_seconds, meter.statements, meter.rounds = 0.0, 0, 0
    started = time.monotonic()
    parent = _accept(engine, machines, max_failures, version)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_notify(:c, '')"), {"c": EXECUTION_READY_CHANNEL})
        conn.commit()
    give_up = started + 1800
    while (end := _ended(engine, parent)) is None:
        if time.monotonic() > give_up:
            raise SystemExit("gave up waiting for the rollout to end")
        time.sleep(0.05)
    wall = time.monotonic() - started
    with engine.connect() as conn:
        rollout = conn.execute(
            text("SELECT * FROM rollout WHERE execution_id = :id"), {"id": parent}
        ).one()
        children = conn.execute(
            text(
                """SELECT c.status, c.ended_at, e.created_at FROM rollout_child c
                   JOIN execution e ON e.id = c.execution_id
                   WHERE c.rollout_id = :id"""
            ),
            {"id": rollout.id},
        ).all()
    failures = sorted(c.ended_at for c in children if c.status == "failed")
    spent_at = failures[rollout.max_failures] if len(failures) > rollout.max_failures else None
    after_spent = 0 if spent_at is None else sum(1 for c in children if c.created_at > spent_at)
    started_children = len(children)
    return {
        "status": end.status,
        "errorCode": end.error_code,
        "wall_seconds": round(wall, 2),
        "children_started": started_children,
        "children_per_second": round(started_children / wall, 1),
        "succeeded": rollout.succeeded,
        "failed": rollout.failed,
        "skipped": rollout.total - rollout.next_index,
        "max_failures": rollout.max_failures,
        "failures_above_the_one_that_spent_it": (
            None if spent_at is None else rollout.failed - rollout.max_failures - 1
        ),
        "children_created_after_the_budget_was_spent": after_spent,
        "parent_rounds": meter.rounds,
        "parent_cpu_ms_per_child": round(1000 * meter.cpu_seconds / max(started_children, 1), 3),
        "parent_statements_per_child": round(meter.statements / max(started_children, 1), 2),
    }


def run(dsn: str, n: int, concurrency: int) -> dict[str, Any]:
    name = f"bench_rollout_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(dsn, name)
    engine = make_engine(target, pool_size=4)
    meter = ParentMeter()
    rollout_adapter.Rollouts.invoke = meter.wrap(rollout_adapter.Rollouts.invoke)  # type: ignore[method-assign]
    event.listen(Engine, "before_cursor_execute", meter.count)
    worker = None
    machines = [f"m-{i:04}" for i in range(n)]
    failing = frozenset(m for i, m in enumerate(machines) if i % 10 == 3)
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        settings = Settings.from_env(
            {}, database_url=target, worker_concurrency=concurrency, worker_batch=concurrency
        )
        registry = AdapterRegistry()
        register_builtins(registry, settings)
        registry.add(_noop(failing))
        worker = Worker(settings, make_engine(target, pool_size=concurrency + 2), registry)
        worker.start()
        clean = _one_rollout(engine, meter, [f"ok-{m}" for m in machines], 0, 1)
        ten_percent = _one_rollout(engine, meter, machines, "5%", 2)
    finally:
        if worker is not None:
            worker.request_stop()
            worker.join(60)
        engine.dispose()
        throughput.admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return {
        "items": n,
        "batch": BATCH,
        "worker_concurrency": concurrency,
        "all_succeed": clean,
        "every_tenth_fails_budget_5_percent": ten_percent,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a superuser or CREATEDB role's URL")
    parser.add_argument("-n", type=int, default=1000, help="machines (items)")
    parser.add_argument("--concurrency", type=int, default=16, help="WORKER_CONCURRENCY")
    args = parser.parse_args()
    result = run(args.dsn, args.n, args.concurrency)
    result["machine"] = throughput.machine_info(args.dsn)
    print(json.dumps(result, indent=2))
    late = result["every_tenth_fails_budget_5_percent"][
        "children_created_after_the_budget_was_spent"
    ]
    return 0 if late == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
