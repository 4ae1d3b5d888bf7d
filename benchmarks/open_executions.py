"""What the quota openExecutions costs an acceptance: its count, by how full the organization is.

    python benchmarks/open_executions.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

On a scratch database (created and dropped; the DSN is a superuser or CREATEDB role):
one organization's open executions grow to 1,000, 10,000 and 100,000 (PENDING, not due),
beside --ended ended ones of its own and as many open ones of another organization. At
each size the count an acceptance runs (queue.open_executions.count_open, up to the
default limit of 100,000) is timed --repeat times, first right after the rows are written
(the visibility map not yet set: the index-only scan visits the heap), then after VACUUM
(the index alone), with the plan's buffers of the last. Printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bulk_actions  # noqa: E402
import throughput  # noqa: E402

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.db.engine import make_engine  # noqa: E402
from orquestador.db.schema import OPEN_EXECUTION  # noqa: E402
from orquestador.queue.open_executions import count_open  # noqa: E402

ORG = bulk_actions.ORG
LIMIT = 100_000
SIZES = (1_000, 10_000, 100_000)


def arrange(engine: Engine, flow_id: uuid.UUID, org: str, count: int, status: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("""
            WITH requests AS (
                INSERT INTO request (org_id, owner_id, flow_id, state, revision, data,
                                     created_by)
                SELECT :org, 'alice', :flow, 'cart', 2, '{}'::jsonb, 'alice'
                FROM generate_series(1, :count)
                RETURNING id
            )
            INSERT INTO execution (request_id, org_id, flow_id, transition_id,
                                   accepted_revision, accepted_state, actor_snapshot,
                                   status, next_attempt_at, finished_at)
            SELECT id, :org, :flow, 'pay', 2, 'cart', '{"sub": "alice"}', :status,
                   now() + interval '1 day',
                   CASE WHEN :status = 'SUCCEEDED' THEN now() END
            FROM requests
            """),
            {"org": org, "flow": flow_id, "count": count, "status": status},
        )


def timed(engine: Engine, repeat: int) -> dict[str, float]:
    seconds = []
    with engine.connect() as conn:
        for _ in range(repeat):
            began = time.perf_counter()
            count_open(conn, ORG, up_to=LIMIT)
            seconds.append(time.perf_counter() - began)
            conn.rollback()
    ms = sorted(s * 1000 for s in seconds)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[max(0, int(len(ms) * 0.99) - 1)], 3),
    }


def plan(engine: Engine) -> str:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT count(*) FROM ("
                f"SELECT 1 FROM execution WHERE org_id = :org AND {OPEN_EXECUTION}"
                " LIMIT :limit) AS o"
            ),
            {"org": ORG, "limit": LIMIT},
        ).scalars()
        return " | ".join(line.strip() for line in rows)


def run(dsn: str, ended: int, repeat: int) -> dict:
    name = f"orquestador_open_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(dsn, name)
    engine = make_engine(target)
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        flow_id = bulk_actions.publish(engine)
        arrange(engine, flow_id, ORG, ended, "SUCCEEDED")
        results: dict[str, dict] = {}
        have = 0
        for size in SIZES:
            arrange(engine, flow_id, ORG, size - have, "PENDING")
            arrange(engine, flow_id, "neighbour", size - have, "PENDING")
            have = size
            with engine.connect() as conn:
                conn.execute(text("ANALYZE execution"))
                conn.commit()
            fresh = timed(engine, repeat)
            throughput.admin(target, "VACUUM execution")
            vacuumed = timed(engine, repeat)
            results[str(size)] = {"fresh": fresh, "vacuumed": vacuumed, "plan": plan(engine)}
        return {
            "machine": throughput.machine_info(dsn),
            "ended_executions": ended,
            "limit": LIMIT,
            "open": results,
        }
    finally:
        engine.dispose()
        throughput.admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("ORQUESTADOR_TEST_DATABASE_URL", ""),
        help="a superuser (or CREATEDB) connection (default: ORQUESTADOR_TEST_DATABASE_URL)",
    )
    parser.add_argument("--ended", type=int, default=200_000, help="ended executions beside")
    parser.add_argument("--repeat", type=int, default=200, help="counts timed at each size")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or ORQUESTADOR_TEST_DATABASE_URL) is required")
    dsn = sqlalchemy_url(args.dsn).render_as_string(hide_password=False)
    print(json.dumps(run(dsn, args.ended, args.repeat), indent=2))


if __name__ == "__main__":
    main()
