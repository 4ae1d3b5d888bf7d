"""The batching headroom in pure SQL: our protocol with k executions per statement, by pgbench.

    python benchmarks/batched_protocol.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

The same-protocol baseline (protocol_script.py) runs the worker's statements one
execution at a time. This runs the shape the protocol writer of docs/PERFORMANCE.md
would send: per pgbench transaction, one claim of k executions (the claim statement of
orquestador/queue/claims.py, read when this runs, aggregated into arrays), then one
multi-row fenced RUNNING statement, one multi-row fenced SUCCEEDED statement, and one
finish transaction for the k executions (BEGIN and both locks in one round trip, the
multi-row write and COMMIT in a second), every row fenced by its own token under a row
lock. Those multi-row statements are written here for the measurement, as a sketch of
the design; they are not the product's. Per-row values that the worker would send as
arrays (input hash, external key) are the same constants the one-at-a-time script uses.

For each `clients x k` of --shapes it prints executions/s (SUCCEEDED rows over the run)
beside the one-at-a-time ceiling (k = 1 with the product's own statements, 10 clients).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, pool, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import protocol_script  # noqa: E402
import throughput  # noqa: E402  (also puts the repository on sys.path)

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.queue import claims  # noqa: E402


def one_line(sql: str) -> str:
    lines = [re.sub(r"--.*$", "", line) for line in sql.splitlines()]
    return " ".join(" ".join(lines).split())


def batched_claim() -> str:
    """The product's claim (its UPDATE is the `claimed` CTE), returning arrays of what it
    claimed instead of a row each."""
    claim = claims._CLAIM.text
    at = claim.rindex("SELECT claimed.*")
    return one_line(
        claim[:at] + "SELECT array_agg(id ORDER BY id) AS ids,"
        " array_agg(fencing_token ORDER BY id) AS tokens,"
        " array_agg(request_id ORDER BY id) AS rids FROM claimed"
    )


# The rows of the batch, and the executions locked under the fence, in id order. Every
# statement also names its rows by key value (= ANY of the ids), so that any plan, a
# generic one included, reaches them by primary key rather than by joining the input
# with a scan of a table that grows (the lesson of the claim and SUCCEEDED statements).
_HOLDER = """
    input AS (
        SELECT * FROM unnest(CAST(:c_ids AS uuid[]), CAST(:c_tokens AS bigint[]),
                             CAST(:c_rids AS uuid[])) AS i(id, token, request_id)
    ), holder AS (
        SELECT e.id, i.token, i.request_id FROM execution e JOIN input i ON e.id = i.id
        WHERE e.id = ANY (CAST(:c_ids AS uuid[]))
          AND e.status = 'RUNNING' AND e.lease_owner = :owner AND e.fencing_token = i.token
          AND e.lease_expires_at > clock_timestamp()
        ORDER BY e.id FOR UPDATE OF e
    )"""

START = f"""
    WITH {_HOLDER}, interrupted AS (
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT a.execution_id, a.action_id, a.attempt, a.fencing_token,
               CASE WHEN a.effect = 'READ_ONLY' THEN 'FAILED' ELSE 'UNKNOWN' END,
               'INTERRUPTED', NULL, a.started_at, NULL
        FROM action_execution a JOIN holder h ON a.execution_id = h.id
        WHERE a.execution_id = ANY (CAST(:c_ids AS uuid[])) AND a.action_id = :action_id
          AND a.status = 'RUNNING'
          AND a.external_key = h.id::text AND a.effect <> 'NON_IDEMPOTENT_WRITE'
        ON CONFLICT DO NOTHING
    )
    INSERT INTO action_execution AS a (
        execution_id, action_id, status, attempt, fencing_token, input_hash, external_key,
        effect, capability, adapter_version, output, error_code, started_at, finished_at)
    SELECT h.id, :action_id, 'RUNNING', :attempt, h.token, :input_hash, h.id::text,
           :effect, :capability, :adapter_version, NULL, NULL, clock_timestamp(), NULL
    FROM holder h
    ON CONFLICT (execution_id, action_id) DO UPDATE
    SET status = 'RUNNING', attempt = EXCLUDED.attempt, fencing_token = EXCLUDED.fencing_token,
        input_hash = EXCLUDED.input_hash, external_key = EXCLUDED.external_key,
        effect = EXCLUDED.effect, capability = EXCLUDED.capability,
        adapter_version = EXCLUDED.adapter_version, output = NULL, error_code = NULL,
        started_at = EXCLUDED.started_at, finished_at = NULL
    WHERE a.status <> 'SUCCEEDED' AND a.external_key = EXCLUDED.external_key
      AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE' AND a.status IN ('RUNNING', 'UNKNOWN'))
    RETURNING a.execution_id;
"""

SUCCEED = f"""
    WITH {_HOLDER}, succeeded AS (
        UPDATE action_execution AS a
        SET status = 'SUCCEEDED', output = :output, finished_at = clock_timestamp()
        FROM holder h
        WHERE a.execution_id = ANY (CAST(:c_ids AS uuid[])) AND a.action_id = :action_id
          AND a.execution_id = h.id AND a.status = 'RUNNING' AND a.fencing_token = h.token
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                  a.finished_at
    )
    INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                error_code, message, started_at, finished_at)
    SELECT execution_id, action_id, attempt, fencing_token, 'SUCCEEDED', NULL, NULL,
           started_at, finished_at
    FROM succeeded
    RETURNING execution_id;
"""

LOCK_REQUESTS = """
    SELECT r.id, r.state, r.revision, r.flow_id, r.busy_execution_id
    FROM request r WHERE r.id = ANY (CAST(:c_rids AS uuid[]))
    ORDER BY r.id FOR UPDATE;
"""

LOCK_EXECUTIONS = f"""
    WITH {_HOLDER}
    SELECT e.id, e.org_id, e.request_id, e.flow_id, e.transition_id, e.accepted_state,
           e.accepted_revision,
           coalesce((SELECT array_agg(a.action_id) FROM action_execution a
                     WHERE a.execution_id = e.id AND a.status = 'SUCCEEDED'), '{{}}')
    FROM execution e JOIN holder h ON h.id = e.id
    WHERE e.id = ANY (CAST(:c_ids AS uuid[]));
"""

# For each row: request moved, audit row, execution ended, all joined on the rows that
# still pass the fence, so an execution is written whole or not at all.
COMPLETE = f"""
    WITH {_HOLDER}, moved AS (
        UPDATE request r
        SET data = :data, state = :state, revision = r.revision + 1,
            busy_execution_id = NULL, updated_at = clock_timestamp()
        FROM holder h
        WHERE r.id = ANY (CAST(:c_rids AS uuid[]))
          AND r.id = h.request_id AND r.busy_execution_id = h.id
        RETURNING r.id AS request_id, r.revision, h.id AS execution_id, h.token
    ), audited AS (
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT x.org_id, 'TRANSITION_COMPLETED', m.request_id, m.execution_id, :actor,
               :detail || jsonb_build_object('revision', m.revision,
                                             'transitionId', x.transition_id,
                                             'fromState', x.accepted_state)
        FROM moved m JOIN execution x ON x.id = m.execution_id
    )
    UPDATE execution AS e
    SET status = 'SUCCEEDED', result = :result, error_code = NULL, error_detail = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        finished_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM moved m
    WHERE e.id = ANY (CAST(:c_ids AS uuid[]))
      AND e.id = m.execution_id AND e.status = 'RUNNING' AND e.lease_owner = :owner
      AND e.fencing_token = m.token AND e.lease_expires_at > clock_timestamp()
    RETURNING e.id, m.revision;
"""


_WRITTEN = text(
    """SELECT (SELECT count(*) FROM execution WHERE status = 'SUCCEEDED'),
              (SELECT count(*) FROM action_execution a JOIN execution e
                 ON e.id = a.execution_id
               WHERE a.status = 'SUCCEEDED' AND e.status = 'SUCCEEDED'),
              (SELECT count(*) FROM audit_event WHERE kind = 'TRANSITION_COMPLETED'),
              (SELECT count(*) FROM request WHERE state = 'done' AND busy_execution_id IS NULL)"""
)


def script() -> str:
    return "\n".join(
        [
            "-- claim k (autocommit), aggregated into arrays",
            batched_claim(),
            "\\gset c_",
            "-- RUNNING for the k rows (autocommit)",
            one_line(START),
            "-- SUCCEEDED for the k rows (autocommit)",
            one_line(SUCCEED),
            "-- finish for the k rows: BEGIN and both locks, then the write and COMMIT",
            "\\startpipeline",
            "BEGIN;",
            one_line(LOCK_REQUESTS),
            one_line(LOCK_EXECUTIONS),
            "\\endpipeline",
            "\\startpipeline",
            one_line(COMPLETE),
            "COMMIT;",
            "\\endpipeline",
        ]
    )


def defines(k: int) -> list[str]:
    values = {**protocol_script.variables(), "limit": str(k)}
    return [arg for name, value in values.items() for arg in ("-D", f"{name}={value}")]


def batched_rates(
    dsn: str,
    shapes: list[tuple[int, int]],
    seconds: int,
    runs: int,
    rows: int,
    history: int = 100_000,
) -> list[dict]:
    """Median executions/s for each (clients, k), on a scratch database migrated the
    usual way, refilled by baseline_setup.sql and batched_history.sql before each run.
    k = 0 stands for the product's own one-at-a-time script (protocol_script.py) on the
    same data, so the batched rows have a like-for-like reference."""
    name = f"bench_batched_{uuid.uuid4().hex[:8]}"
    throughput.admin(dsn, f'CREATE DATABASE "{name}"')
    url = throughput.with_database(dsn, name)
    target = throughput.libpq(url)
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    results = []
    try:
        migrate.upgrade(migrate.alembic_config(url=url, runtime_role=None))
        definition = json.dumps(protocol_script.flow_definition())
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "batched.pgb"
            path.write_text(script() + "\n")
            product = Path(folder) / "protocol.pgb"
            product.write_text(protocol_script.script())
            for clients, k in shapes:
                rates = []
                for _ in range(runs):
                    throughput.psql_file(
                        target, HERE / "baseline_setup.sql", nrows=str(rows), definition=definition
                    )
                    if history:
                        throughput.psql_file(
                            target, HERE / "batched_history.sql", nhistory=str(history)
                        )
                    if k == 0:
                        throughput.pgbench_rate(
                            target, seconds, clients, product, protocol_script.pgbench_defines()
                        )
                    else:
                        throughput.pgbench_rate(target, seconds, clients, path, defines(k))
                    with engine.connect() as conn:
                        done, steps, audits, released = conn.execute(_WRITTEN).one()
                    # The history has its executions, checkpoints and requests, no audit.
                    done, steps, released = done - history, steps - history, released - history
                    if not done or not (done == steps == audits == released):
                        # Every finished execution must have all of its rows: a sketch
                        # that loses a write would measure the wrong thing.
                        raise RuntimeError(
                            f"{clients}x{k}: {done} executions, {steps} checkpoints, "
                            f"{audits} audit rows, {released} requests moved"
                        )
                    rates.append(done / seconds)
                results.append({"clients": clients, "k": k, "rate": statistics.median(rates)})
    finally:
        engine.dispose()
        throughput.admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--shapes",
        default="10x0,10x1,2x5,4x5,2x10",
        help="pgbench clients x executions per statement (k); k = 0 is the product's own "
        "one-at-a-time script, the reference",
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000, help="due executions per run")
    parser.add_argument(
        "--history", type=int, default=100_000, help="finished executions beside them"
    )
    parser.add_argument("--print-script", action="store_true")
    args = parser.parse_args()
    if args.print_script:
        print(script())
        return 0

    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    results = batched_rates(args.dsn, shapes, args.seconds, args.runs, args.rows, args.history)
    reference = next((r["rate"] for r in results if r["k"] == 0), None)
    print()
    print("| pgbench clients | executions per statement (k) | executions/s | of one-at-a-time |")
    print("|---|---|---|---|")
    for row in results:
        what = "1, the product's statements" if row["k"] == 0 else str(row["k"])
        share = f"{row['rate'] / reference:.2f}" if reference else ""
        print(f"| {row['clients']} | {what} | {row['rate']:,.0f} | {share} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
