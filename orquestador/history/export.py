"""The history before a date as JSON lines: one audit row or attempt a line, streamed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime
from typing import Any, TextIO

from sqlalchemy import Connection, text

# Each table in its primary key's order (an index scan of every month before the date,
# merged): a second export of the same range prints the same lines in the same order.
_QUERIES = {
    "audit_event": text(
        "SELECT id, org_id, kind, request_id, execution_id, actor, detail, created_at"
        " FROM audit_event WHERE created_at < :before ORDER BY id"
    ),
    "action_attempt": text(
        "SELECT execution_id, action_id, attempt, fencing_token, status, error_code, message,"
        " started_at, finished_at FROM action_attempt WHERE started_at < :before"
        " ORDER BY execution_id, action_id, attempt, started_at"
    ),
}
# Rows fetched at a time from the server-side cursor: memory stays flat however many.
FETCH_ROWS = 2000


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def history_lines(conn: Connection, before: datetime) -> Iterator[tuple[str, str]]:
    """(table, JSON line) for every audit row, then every attempt, dated before BEFORE.

    Read through a server-side cursor; run it in one REPEATABLE READ transaction so both
    tables come from the same snapshot.
    """
    for table, query in _QUERIES.items():
        result = conn.execution_options(stream_results=True, yield_per=FETCH_ROWS).execute(
            query, {"before": before}
        )
        for row in result.mappings():
            line = {"table": table, **{key: _plain(value) for key, value in row.items()}}
            yield table, json.dumps(line, separators=(",", ":"), ensure_ascii=False)


def export_history(
    conn: Connection,
    before: datetime,
    out: TextIO,
    *,
    progress: Callable[[str, int], None] | None = None,
    every: int = 100_000,
) -> dict[str, int]:
    """Write history_lines to OUT, one a line; rows written per table.

    PROGRESS(table, rows so far) is called every EVERY rows of a table.
    """
    counts = dict.fromkeys(_QUERIES, 0)
    for table, line in history_lines(conn, before):
        out.write(line)
        out.write("\n")
        counts[table] += 1
        if progress is not None and counts[table] % every == 0:
            progress(table, counts[table])
    return counts
