"""Where the WAL goes per execution: pg_walinspect over one benchmark drain.

    python benchmarks/wal_profile.py --dsn postgresql://postgres@127.0.0.1:5432/postgres -n 8000

Drains an N-execution backlog with one worker process (throughput.py's backlog run,
concurrency 10) in a scratch database, with the pg_walinspect extension (PostgreSQL 15
or later, in its contrib package; the DSN must be a superuser's) created in that
database. The WAL between the workers' start and the drain's end is read back record by
record and grouped by the relation of each record's first block (a table, an index, a
TOAST table) and by the resource manager and record type; records of no relation
(commits, running-transaction snapshots) are grouped by type. Records that touch
another database's relations are counted apart: the server is shared.

Prints per group: records and bytes per execution, and how many of those bytes were
full-page images. A page's first change after a checkpoint carries an image of the
whole page; `--checkpoint` issues CHECKPOINT right before the workers start, so every
page the drain changes carries one once (the cost right after each checkpoint), and
without it images appear only if a checkpoint happens during the drain. Both are worth
reading: the bytes without images are what each execution writes in steady state.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from collections import defaultdict
from pathlib import Path

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402  (also puts the repository on sys.path)

from orquestador.config import sqlalchemy_url  # noqa: E402

# "blkref #0: rel 1663/16384/16401 fork main blk 7": tablespace/database/relfilenode.
_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)")

_ELSEWHERE = ("(another database)", "(shared catalog)")
_RECORDS = text(
    """SELECT resource_manager, record_type, record_length, fpi_length, block_ref
       FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))"""
)
_RELATIONS = text(
    """SELECT pg_relation_filenode(c.oid), c.relname, c.relkind,
              coalesce(t.relname, '') AS toast_of
       FROM pg_class c LEFT JOIN pg_class t ON t.reltoastrelid = c.oid
       WHERE pg_relation_filenode(c.oid) IS NOT NULL"""
)


def profile(
    dsn: str,
    n: int,
    actions: int,
    checkpoint: bool,
    setup_sql: str = "",
    settings: tuple[str, ...] = (),
) -> dict:
    lsn: dict[str, str] = {}
    records: list = []
    names: dict[int, str] = {}
    database_oid: list[int] = []

    # A temporary replication slot, held by this connection until the end, keeps the
    # drain's WAL from being recycled by a checkpoint before it is read (a shared server's
    # other databases may write, and checkpoint, a lot meanwhile).
    keeper = create_engine(
        sqlalchemy_url(dsn), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
    ).connect()

    def ready(target: str) -> None:
        keeper.execute(
            text("SELECT pg_create_physical_replication_slot(:name, true, true)"),
            {"name": f"wal_profile_{uuid.uuid4().hex[:8]}"},
        )
        engine = create_engine(
            sqlalchemy_url(target), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        with engine.connect() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
            for setting in settings:  # the workers' sessions start after this
                name, value = setting.split("=", 1)
                conn.exec_driver_sql(
                    f'ALTER DATABASE "{make_url(target).database}" SET {name} = {value}'
                )
            # One statement at a time: VACUUM cannot run inside a multi-statement query.
            for statement in filter(str.strip, setup_sql.split(";")):
                conn.exec_driver_sql(statement)
            if checkpoint:
                conn.execute(text("CHECKPOINT"))
            database_oid.append(
                conn.execute(
                    text("SELECT oid FROM pg_database WHERE datname = current_database()")
                ).scalar_one()
            )
            lsn["start"] = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
        engine.dispose()

    def drained(target: str) -> None:
        engine = create_engine(sqlalchemy_url(target), poolclass=pool.NullPool)
        with engine.connect() as conn:
            # The records up to what is flushed: every commit of the drain is.
            lsn["end"] = str(conn.execute(text("SELECT pg_current_wal_flush_lsn()")).scalar_one())
            records.extend(conn.execute(_RECORDS, lsn).all())
            for filenode, relname, relkind, toast_of in conn.execute(_RELATIONS):
                kind = {"i": "index", "t": "toast", "r": "table", "p": "table"}.get(relkind, "")
                names[int(filenode)] = (
                    f"{relname} (toast of {toast_of})"
                    if toast_of
                    else (f"{relname} ({kind})" if kind == "index" else relname)
                )
        engine.dispose()

    try:
        run = throughput.run_backlog(dsn, n, actions, 1, 10, 10, on_ready=ready, on_drained=drained)
    finally:
        keeper.close()  # and with it the temporary slot
    done = run["done"]
    by_relation: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    by_type: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for rmgr, rtype, length, fpi, blocks in records:
        found = _BLOCK.search(blocks or "")
        if found is None:
            relation = "(no relation)"
        elif int(found.group(2)) != database_oid[0]:
            relation = "(another database)" if int(found.group(2)) else "(shared catalog)"
        else:
            relation = names.get(int(found.group(3)), f"relfilenode {found.group(3)}")
        for key, table in ((relation, by_relation), ((relation, rmgr, rtype), by_type)):
            entry = table[key]  # type: ignore[index]
            entry[0] += 1
            entry[1] += int(length)
            entry[2] += int(fpi or 0)
    # The run's own: its database's relations and the records of none (commits; those of
    # other databases' transactions cannot be told apart and count too).
    own = [e for key, e in by_relation.items() if key not in _ELSEWHERE]
    total = sum(entry[1] for entry in own)
    images = sum(entry[2] for entry in own)
    elsewhere = sum(e[1] for key, e in by_relation.items() if key in _ELSEWHERE)
    return {
        "run": run,
        "checkpoint_at_start": checkpoint,
        "setup_sql": setup_sql,
        "settings": list(settings),
        "wal_bytes_per_execution": round(total / done),
        "full_page_image_bytes_per_execution": round(images / done),
        "without_images_bytes_per_execution": round((total - images) / done),
        "records_per_execution": round(sum(e[0] for e in own) / done, 2),
        "other_databases_bytes_per_execution": round(elsewhere / done),
        "by_relation": _rows(by_relation, done),
        "by_record": _rows({" / ".join(k): v for k, v in by_type.items()}, done),
    }


def _rows(groups: dict[str, list[int]], done: int) -> list[dict]:
    return [
        {
            "group": key,
            "records": round(count / done, 2),
            "bytes": round(length / done),
            "image_bytes": round(fpi / done),
            "bytes_without_images": round((length - fpi) / done),
        }
        for key, (count, length, fpi) in sorted(groups.items(), key=lambda kv: -kv[1][1])
    ]


def print_table(title: str, rows: list[dict]) -> None:
    print()
    print(f"| {title} | records | bytes | of which page images | bytes without images |")
    print("|---|---|---|---|---|")
    for row in rows:
        if row["bytes"] < 1 and row["records"] < 0.01:
            continue
        print(
            f"| {row['group']} | {row['records']} | {row['bytes']:,} | {row['image_bytes']:,} "
            f"| {row['bytes_without_images']:,} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=8_000, help="executions in the backlog")
    parser.add_argument("--actions", type=int, default=1)
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="CHECKPOINT right before the workers start: every changed page's first "
        "change carries a full-page image",
    )
    parser.add_argument(
        "--setup-sql",
        default="",
        help="SQL run in the scratch database once the backlog is in place, before the "
        "workers start (a storage parameter or an index to try without a migration); "
        "statements separated by semicolons run one by one, outside a transaction",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the scratch database's sessions (ALTER DATABASE ... SET), such "
        "as wal_compression=lz4; repeatable",
    )
    parser.add_argument("--json", default="", help="also write the result to this file")
    args = parser.parse_args()

    print("machine:", json.dumps(throughput.machine_info(args.dsn)), flush=True)
    result = profile(
        args.dsn, args.n, args.actions, args.checkpoint, args.setup_sql, tuple(args.set)
    )
    run = result["run"]
    print("backlog:", json.dumps(run), flush=True)
    print()
    print(
        f"{run['done']} executions, {args.actions} action(s) at {run['rate']}/s; "
        f"checkpoint at start: {'yes' if args.checkpoint else 'no'}. WAL per execution "
        f"{result['wal_bytes_per_execution']:,} bytes in {result['records_per_execution']} "
        f"records, of which full-page images {result['full_page_image_bytes_per_execution']:,}"
        f" (without them {result['without_images_bytes_per_execution']:,}); other "
        f"databases' and shared catalogs' records in the same span, not counted: "
        f"{result['other_databases_bytes_per_execution']:,} bytes per execution."
    )
    print_table("relation, per execution", result["by_relation"])
    print_table("relation / resource manager / record, per execution", result["by_record"])
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
