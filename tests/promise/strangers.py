"""A stranger session (a report, a person at a psql prompt) holding FOR UPDATE on one row."""

from __future__ import annotations

import threading
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


def hold_bulk_item(
    engine: Engine,
    bulk_id: uuid.UUID,
    execution_id: uuid.UUID,
    had: threading.Event,
    release: threading.Event,
    most: float,
    held: threading.Event,
) -> Hold:
    """Hold a bulk's item (NOWAIT: if its worker has it already, say so) until `release`
    is set or `most` seconds pass; `had` is set once the lock is had or was not, `held`
    only when it is."""
    try:
        with engine.connect() as conn, conn.begin():
            found = conn.execute(
                text(
                    "SELECT 1 FROM bulk_item WHERE bulk_id = :bulk AND execution_id = :id"
                    " AND outcome IS NULL FOR UPDATE NOWAIT"
                ),
                {"bulk": bulk_id, "id": execution_id},
            ).first()
            if found is None:
                return Hold("the item had its outcome already")
            began = time.time()
            held.set()
            had.set()
            release.wait(most)  # held until the race's other half has played out
        return Hold("held", began, time.time())
    except DBAPIError as error:
        cause = getattr(error, "orig", None) or error
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        return Hold(f"not had: {type(cause).__name__}: {first}")
    finally:
        had.set()
