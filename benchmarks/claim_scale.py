"""The claim's cost as the number of due executions grows: EXPLAIN (ANALYZE, BUFFERS) per size.

    python benchmarks/claim_scale.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

In a scratch database migrated the usual way (created and dropped here), fills due
executions as the API leaves them (request busy, execution PENDING; throughput.py's
bulk insert, in chunks) up to each size of --sizes, and at each size runs the claim
statement as the worker sends it: the `_CLAIM` text of orquestador/queue/claims.py,
read when this script runs, prepared once with its bind parameters as $n, executed
under EXPLAIN (ANALYZE, BUFFERS) inside a transaction that is rolled back (so the same
rows stay due), --repeats times with a custom plan and as often with the generic plan
that a long-lived prepared statement may switch to. Prints the median execution time
and the buffers touched per size and plan, and the plans at the largest size.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
from sqlalchemy import Engine, create_engine, pool, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import protocol_script  # noqa: E402
import throughput  # noqa: E402  (also puts the repository on sys.path)

from orquestador.config import sqlalchemy_url  # noqa: E402
from orquestador.db import migrate  # noqa: E402
from orquestador.queue import claims  # noqa: E402

_BIND = re.compile(r"(?<![:\w]):(\w+)")
CHUNK = 100_000


def prepared_claim() -> tuple[str, list[str]]:
    """The claim's SQL with $1.. for its binds, and the bind names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _BIND.sub(number, claims._CLAIM.text), names


def explain(conn: psycopg.Connection, args: dict[str, object], names: list[str]) -> list[str]:
    values = ", ".join("%s" for _ in names)
    # Values inlined by the client: EXPLAIN EXECUTE takes no parameters of its own.
    with conn.transaction(force_rollback=True), psycopg.ClientCursor(conn) as cur:
        rows = cur.execute(
            f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE claim ({values})", [args[n] for n in names]
        ).fetchall()
    return [row[0] for row in rows]


def execution_ms(plan: list[str]) -> float:
    return float(next(line for line in plan if line.startswith("Execution Time")).split()[2])


def top_buffers(plan: list[str]) -> str:
    found = next((line.strip() for line in plan if "Buffers:" in line), "")
    return found.removeprefix("Buffers: ")


# The rows accept_backlog just wrote (organization 'bench') spread over organizations,
# priorities and concurrency keys, as a busy multi-tenant queue holds them: the claim
# must find each organization's best work without reading the rest.
_SCATTER = text(
    """
    UPDATE execution
    SET org_id = 'org-' || (abs(hashtext(id::text)) % :orgs),
        priority = abs(hashtext(id::text || 'p')) % 10,
        concurrency_key = CASE WHEN abs(hashtext(id::text || 'k')) % 3 = 0
                               THEN 'm-' || (abs(hashtext(id::text || 'm')) % 5000) END,
        concurrency_limit = CASE WHEN abs(hashtext(id::text || 'k')) % 3 = 0 THEN 1 END,
        key_blocked = abs(hashtext(id::text || 'k')) % 6 = 0
    WHERE org_id = 'bench'
    """
)


def scatter(engine: Engine, dsn: str, orgs: int) -> None:
    with engine.begin() as conn:
        conn.execute(_SCATTER, {"orgs": orgs})
    with psycopg.connect(throughput.libpq(dsn), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE execution")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--limit", type=int, default=10, help="the claim's batch (WORKER_BATCH)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--plans", default="", help="write the plans at every size here")
    parser.add_argument(
        "--orgs",
        type=int,
        default=1,
        help="spread the executions over this many organizations, with priorities 0-9 and"
        " a third of them keyed (one of 5,000 machines each, limit 1; half of those blocked)",
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    name = f"bench_claim_{uuid.uuid4().hex[:8]}"
    throughput.admin(args.dsn, f'CREATE DATABASE "{name}"')
    target = throughput.with_database(args.dsn, name)
    engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
    results, plans = [], {}
    try:
        migrate.upgrade(migrate.alembic_config(url=target, runtime_role=None))
        definition = protocol_script.flow_definition(1)
        with engine.begin() as conn:
            flow_id = conn.execute(
                text(
                    """INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                         created_by)
                       VALUES ('bench', 'scale', 1, 'manual', CAST(:d AS jsonb),
                               '{"type":"object"}', 'bench') RETURNING id"""
                ),
                {"d": json.dumps(definition)},
            ).scalar_one()
        sql, names = prepared_claim()
        bind = {
            "limit": args.limit,
            "owner": "claim-scale",
            "lease_seconds": 60.0,
            "weights": json.dumps({}),
        }
        filled = 0
        for size in sizes:
            started = time.monotonic()
            while filled < size:
                chunk = min(CHUNK, size - filled)
                throughput.accept_backlog(engine, flow_id, chunk)  # ends with VACUUM ANALYZE
                if args.orgs > 1:
                    scatter(engine, target, args.orgs)
                filled += chunk
            fill_s = time.monotonic() - started
            with psycopg.connect(throughput.libpq(target), autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE request")
                conn.execute("SET jit = off")  # as every connection of the product
                conn.execute(f"PREPARE claim AS {sql}")
                row: dict[str, object] = {"due": size, "fill_s": round(fill_s, 1)}
                for mode in ("force_custom_plan", "force_generic_plan"):
                    conn.execute(f"SET plan_cache_mode = {mode}")
                    explain(conn, bind, names)  # warm the cache once
                    runs = [explain(conn, bind, names) for _ in range(args.repeats)]
                    kind = mode.split("_")[1]
                    row[f"{kind}_ms"] = round(statistics.median(map(execution_ms, runs)), 3)
                    row[f"{kind}_buffers"] = top_buffers(runs[-1])
                    plans[f"{size} {kind}"] = runs[-1]
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.dispose()
        throughput.admin(args.dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    print()
    spread = (
        f"{args.orgs} organizations, priorities 0-9, a third keyed"
        if args.orgs > 1
        else "one organization, no priorities or keys"
    )
    print(
        f"claim of {args.limit}, {spread}, median of {args.repeats} EXPLAIN ANALYZE runs"
        " (rolled back)"
    )
    print("| due executions | custom plan | generic plan | buffers (custom) | buffers (generic) |")
    print("|---|---|---|---|---|")
    for row in results:
        print(
            f"| {row['due']:,} | {row['custom_ms']} ms | {row['generic_ms']} ms | "
            f"{row['custom_buffers']} | {row['generic_buffers']} |"
        )
    largest = sizes[-1]
    for kind in ("custom", "generic"):
        print()
        print(f"plan at {largest:,} due executions, {kind}:")
        print("\n".join(plans[f"{largest} {kind}"]))
    if args.plans:
        Path(args.plans).write_text(
            "\n\n".join(f"-- {key}\n" + "\n".join(plan) for key, plan in plans.items()) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
