"""Transaction shapes: a single atomic statement in autocommit, or an explicit transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection


@contextmanager
def one_statement(conn: Connection) -> Iterator[Connection]:
    """Run exactly one statement in autocommit mode.

    A single statement is atomic on its own (its row locks last until it ends, and
    it commits as it ends), so BEGIN and COMMIT would only add two round trips.
    The connection goes back to its default isolation level afterwards.
    """
    conn.execution_options(isolation_level="AUTOCOMMIT")
    try:
        with conn.begin():
            yield conn
    finally:
        conn.execution_options(isolation_level=conn.default_isolation_level)
