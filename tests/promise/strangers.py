"""A stranger session (a report, a person at a psql prompt) holding FOR UPDATE on one row."""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

TABLES = ("request", "execution")


def hold_row_lock(engine: Engine, table: str, row_id: uuid.UUID, seconds: float) -> str:
    """Lock the row for `seconds`; what happened (the stranger may wait behind a worker)."""
    assert table in TABLES
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SET LOCAL lock_timeout = '3s'"))
            found = conn.execute(
                text(f"SELECT id FROM {table} WHERE id = :id FOR UPDATE"), {"id": row_id}
            ).first()
            if found is None:
                return "no such row"
            time.sleep(seconds)  # holding the lock is the fault; its length is scheduled
    except DBAPIError as error:
        # A worker held it past the stranger's patience, or the server went away.
        return f"not had: {type(getattr(error, 'orig', None) or error).__name__}"
    return "held"
