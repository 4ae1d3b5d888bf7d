"""A stranger session (a report, a person at a psql prompt) holding FOR UPDATE on one row."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

TABLES = ("request", "execution")


@dataclass(frozen=True)
class Hold:
    """What the stranger managed: `what` is "held" when it had the lock from began to ended."""

    what: str
    began: float = 0.0  # time.time()
    ended: float = 0.0


def hold_row_lock(engine: Engine, table: str, row_id: uuid.UUID, seconds: float) -> Hold:
    """Lock the row for `seconds` (the stranger may first wait behind a worker)."""
    assert table in TABLES
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SET LOCAL lock_timeout = '3s'"))
            found = conn.execute(
                text(f"SELECT id FROM {table} WHERE id = :id FOR UPDATE"), {"id": row_id}
            ).first()
            if found is None:
                return Hold("no such row")
            began = time.time()
            time.sleep(seconds)  # holding the lock is the fault; its length is scheduled
        return Hold("held", began, time.time())
    except DBAPIError as error:
        # A worker held it past the stranger's patience, or the server went away.
        cause = getattr(error, "orig", None) or error
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        return Hold(f"not had: {type(cause).__name__}: {first}")
