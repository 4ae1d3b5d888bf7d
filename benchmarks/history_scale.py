"""The claim, the execution page and the list as the history grows: same run, same server.

    python benchmarks/history_scale.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

In a scratch database migrated the usual way (created and dropped here), with the
history's monthly partitions of the past year made as a year of the leader's passes
leaves them, fills finished executions with their history (2 checkpoints, 3 attempts
and 7 audit rows each: 10 history rows an execution, spread over the last 11 months)
up to each size of --sizes history rows, and at each size measures, as the product
sends them:
- the claim: the `_CLAIM` text of orquestador/queue/claims.py for a batch of 10 over
  1,000 due executions, under EXPLAIN ANALYZE in a transaction rolled back
  (claim_scale.py's method);
- the execution page: the queries GET /executions/ID and the page read for one finished
  execution (its steps, attempts, audit and the view's audit facts);
- the list: GET /executions' queries for a page of 50 (the page, then the steps,
  attempts and view facts of its executions, in one REPEATABLE READ transaction).
Each is the median wall time of --repeats runs after a warm-up (client round trips
included). Prints the machine, one JSON line per size and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy import Connection, Engine, create_engine, pool, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import claim_scale  # noqa: E402
import protocol_script  # noqa: E402
import throughput  # noqa: E402  (also puts the repository on sys.path)

from orquestador.api.access import ExecutionFilter, ResourceAccess  # noqa: E402
from orquestador.api.auth import Caller  # noqa: E402
from orquestador.api.execution_routes import read_view_facts  # noqa: E402
from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402

ORG = "bench"
HISTORY_PER_EXECUTION = 10  # 3 attempts + 7 audit rows
CHUNK_EXECUTIONS = 20_000
DUE = 1_000

# Finished executions with their whole history, in one statement a chunk.
_FILL = text(
    """
    WITH r AS (
        INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, created_by)
        SELECT :org, 'bench', :flow, 'done', 2, '{}'::jsonb, 'bench'
        FROM generate_series(1, :n) RETURNING id
    ), e AS (
        INSERT INTO execution (request_id, org_id, flow_id, transition_id, accepted_revision,
                               accepted_state, actor_snapshot, status, created_at,
                               started_at, finished_at)
        SELECT id, :org, :flow, 'go', 2, 'new', '{"sub": "bench"}'::jsonb, 'SUCCEEDED', t, t,
               t + interval '1 minute'
        FROM (SELECT id, now() - random() * interval '330 days' AS t FROM r) x
        RETURNING id, request_id, created_at
    ), c AS (
        INSERT INTO action_execution (execution_id, action_id, status, attempt, fencing_token,
                                      input_hash, external_key, effect, capability,
                                      adapter_version, started_at, first_started_at,
                                      finished_at)
        SELECT e.id, 'step-' || s, 'SUCCEEDED', s, 1, 'h', e.id || ':' || s, 'READ_ONLY',
               'bench.read', 1, e.created_at, e.created_at, e.created_at + interval '2 s'
        FROM e, generate_series(1, 2) s
    ), a AS (
        -- step-1 failed once before it succeeded; step-2 succeeded at once.
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT e.id, 'step-' || s, k, 1, CASE WHEN s = 1 AND k = 1 THEN 'FAILED'
                                           ELSE 'SUCCEEDED' END,
               CASE WHEN s = 1 AND k = 1 THEN 'TIMEOUT' END, NULL,
               e.created_at + k * interval '1 s', e.created_at + k * interval '1 s'
        FROM e, generate_series(1, 2) s, generate_series(1, 3 - s) k
    )
    INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail, created_at)
    SELECT :org, (ARRAY['TRANSITION_ACCEPTED', 'EXECUTION_STARTED', 'ACTION_STARTED',
                        'ACTION_FAILED', 'ACTION_STARTED', 'TRANSITION_COMPLETED',
                        'EXECUTION_SUCCEEDED'])[k],
           e.request_id, e.id, 'bench', jsonb_build_object('n', k),
           e.created_at + k * interval '1 s'
    FROM e, generate_series(1, 7) k
    """
)


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" load average {load}"
    )


def median_ms(run: Callable[[], object], repeats: int) -> float:
    run()  # warm: the plan cache and the buffers
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def execution_page(engine: Engine, access: ResourceAccess, execution_id: uuid.UUID) -> None:
    with engine.connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            steps = access.execution_steps(connection, execution_id)
            access.execution_attempts(connection, execution_id)
            access.execution_audit(connection, execution_id)
            read_view_facts(connection, access, [execution_id], steps)


def listing(engine: Engine, access: ResourceAccess) -> None:
    with engine.connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            rows = access.list_executions(connection, ExecutionFilter(limit=51))
            ids = [row.id for row in rows[:50]]
            steps = access.steps_of(connection, ids)
            access.attempts_of(connection, ids)
            read_view_facts(connection, access, ids, steps)


def history_rows(connection: Connection) -> int:
    return int(
        connection.execute(
            text(
                "SELECT (SELECT count(*) FROM audit_event) + (SELECT count(*) FROM action_attempt)"
            )
        ).scalar_one()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sizes", default="100000,1000000", help="history rows, ascending")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    name = f"bench_history_{uuid.uuid4().hex[:8]}"
    throughput.admin(args.dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(args.dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.QueuePool)
    results = []
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        with engine.begin() as conn:
            server = conn.execute(text("SHOW server_version")).scalar_one()
            # A year of the leader's passes: a partition a month.
            conn.execute(
                text(
                    "SELECT orquestador_history_month(t, month::date)"
                    " FROM unnest(ARRAY['audit_event', 'action_attempt']) t,"
                    " generate_series(date_trunc('month', now() - interval '12 months'),"
                    " now(), interval '1 month') month"
                )
            )
            flow_id = conn.execute(
                text(
                    """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                         created_by)
                       VALUES (:org, 'history', 1, 'manual', CAST(:d AS jsonb),
                               '{"type":"object"}', 'bench') RETURNING id"""
                ),
                {"org": ORG, "d": json.dumps(protocol_script.flow_definition(1))},
            ).scalar_one()
        print(f"machine: {machine()}; PostgreSQL {server}", flush=True)
        throughput.accept_backlog(engine, flow_id, DUE, org=ORG)
        sql, names = claim_scale.prepared_claim()
        bind = {"limit": 10, "owner": "history-scale", "lease_seconds": 60.0, "weights": "{}"}
        access = ResourceAccess(Caller(sub="bench", org=ORG, scopes=frozenset()))
        filled = 0
        for size in sizes:
            started = time.monotonic()
            while filled < size:
                executions = min(CHUNK_EXECUTIONS, (size - filled) // HISTORY_PER_EXECUTION)
                with engine.begin() as conn:
                    conn.execute(_FILL, {"org": ORG, "flow": flow_id, "n": executions})
                filled += executions * HISTORY_PER_EXECUTION
            with psycopg.connect(throughput.libpq(target), autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
            fill_s = time.monotonic() - started
            with engine.connect() as conn:
                rows = history_rows(conn)
                # A finished execution from the middle of the year.
                middle = conn.execute(
                    text(
                        "SELECT id FROM execution WHERE status = 'SUCCEEDED'"
                        " ORDER BY created_at OFFSET (SELECT count(*) / 2 FROM execution"
                        " WHERE status = 'SUCCEEDED') LIMIT 1"
                    )
                ).scalar_one()
            with psycopg.connect(throughput.libpq(target), autocommit=True) as conn:
                conn.execute("SET jit = off")
                conn.execute(f"PREPARE claim AS {sql}")
                claim_scale.explain(conn, bind, names)
                claim_ms = round(
                    statistics.median(
                        claim_scale.execution_ms(claim_scale.explain(conn, bind, names))
                        for _ in range(args.repeats)
                    ),
                    3,
                )
            row = {
                "history_rows": rows,
                "fill_s": round(fill_s, 1),
                "claim_ms": claim_ms,
                "execution_page_ms": median_ms(
                    lambda m=middle: execution_page(engine, access, m), args.repeats
                ),
                "list_ms": median_ms(lambda: listing(engine, access), args.repeats),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.dispose()
        throughput.admin(args.dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    print()
    print(
        f"medians of {args.repeats} runs; claim: EXPLAIN ANALYZE execution time of a batch of"
        f" 10 over {DUE:,} due executions; page and list: wall time of their queries"
    )
    print("| history rows | claim | execution page | list (50) |")
    print("|---|---|---|---|")
    for row in results:
        print(
            f"| {row['history_rows']:,} | {row['claim_ms']} ms | {row['execution_page_ms']} ms |"
            f" {row['list_ms']} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
