"""The hot statements of the protocol, run on the driver connection as prepared statements.

A worker runs a handful of statements per execution, thousands of times a second,
and its process is CPU-bound: SQLAlchemy's per-statement work (execution context,
parameter processing, result metadata) used to cost about as much as psycopg's.
These statements skip that layer. The SQL stays a module-level `text()` construct
next to the code that uses it; it is compiled to psycopg's placeholders the first
time it runs, and psycopg prepares it on the server the first time each
connection runs it.

Transactions are unchanged: `run` executes on the same DBAPI connection, so inside
`conn.begin()` the statement is part of the caller's transaction. `run_alone` is
`one_statement` for these statements: the same autocommit shape, without
SQLAlchemy's isolation-level bookkeeping around it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from sqlalchemy import Connection, TextClause
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.types import JSON

from orquestador.db.engine import is_failover_error

_DIALECT = psycopg_dialect()  # type: ignore[no-untyped-call]


class _Compiled:
    """A `text()` statement in psycopg's `%(name)s` form."""

    def __init__(self, clause: TextClause) -> None:
        compiled = clause.compile(dialect=_DIALECT)
        self.sql = str(compiled)
        # Parameters bound as JSON/JSONB are sent as jsonb; None is SQL NULL, never
        # the JSON value null (see JSONB_VALUE in db/schema.py).
        self.json_params = frozenset(
            name for name, bind in compiled.binds.items() if isinstance(bind.type, JSON)
        )


# Keyed by the module-level constructs themselves; a race only compiles one twice.
_COMPILED: dict[TextClause, _Compiled] = {}


def _compiled(clause: TextClause) -> _Compiled:
    found = _COMPILED.get(clause)
    if found is None:
        found = _COMPILED[clause] = _Compiled(clause)
    return found


def run(conn: Connection, clause: TextClause, params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
    """Execute on `conn`'s driver connection; rows are named tuples, like SQLAlchemy rows.

    A database error is raised as SQLAlchemy would raise it (an `OperationalError`,
    `IntegrityError`, ... wrapping psycopg's), and a connection the error left broken
    is invalidated so that the pool never hands it out again.
    """
    statement = _compiled(clause)
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    values = {
        name: Jsonb(value) if value is not None and name in statement.json_params else value
        for name, value in params.items()
    }
    cursor = driver.cursor(row_factory=namedtuple_row)
    try:
        cursor.execute(statement.sql, values, prepare=prepares(driver))
    except psycopg.Error as exc:
        raise _translated(conn, driver, exc, statement.sql) from exc
    return cursor


def prepares(driver: psycopg.Connection[Any]) -> bool | None:
    """Prepare on the server, unless the engine said never (DB_PREPARE=false: PgBouncer).

    None leaves it to the connection's `prepare_threshold`, which is then None: never.
    """
    return True if driver.prepare_threshold is not None else None


def _translated(
    conn: Connection, driver: psycopg.Connection[Any], exc: psycopg.Error, sql: str
) -> StatementError:
    broken = driver.broken or driver.closed or is_failover_error(exc)
    if broken:
        conn.invalidate(exc)
        if is_failover_error(exc):
            # The server is no longer the primary: no connection of the pool is worth
            # keeping. The checked-out ones are closed as their users give them back.
            conn.engine.dispose(close=False)
    # No parameters in the error: inputs and outputs may be secret.
    return DBAPIError.instance(
        sql,
        None,
        exc,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=bool(broken),
        dialect=conn.dialect,
    )


@contextmanager
def pipelined(conn: Connection) -> Iterator[None]:
    """Send the `run` statements of the block in one round trip (psycopg pipeline mode).

    The server still runs them one after another, in order, in the caller's
    transaction; their rows can be read once the block has ended. If one fails, the
    ones after it are skipped and the error is raised as `run` raises it, at the
    end of the block at the latest.
    """
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    try:
        with driver.pipeline():
            yield
    except psycopg.Error as exc:
        raise _translated(conn, driver, exc, "(pipeline)") from exc


def run_alone(
    conn: Connection, clause: TextClause, params: Mapping[str, Any]
) -> psycopg.Cursor[Any]:
    """Run one statement in autocommit: atomic on its own, committed as it ends.

    See `one_statement` for why that is enough. psycopg refuses to switch to
    autocommit inside an open transaction, so this can never commit someone
    else's work by accident.
    """
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    before = driver.autocommit
    driver.autocommit = True
    try:
        return run(conn, clause, params)
    finally:
        if not (driver.closed or driver.broken):
            driver.autocommit = before
