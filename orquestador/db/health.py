"""Database checks for `orquestador check` and `orquestador health`."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, create_engine, pool, text

from orquestador.config import Settings, sqlalchemy_url
from orquestador.db.grants import function_present, serial_sequences
from orquestador.db.schema import (
    RUNTIME_FUNCTIONS,
    RUNTIME_GRANTS,
    RUNTIME_UPDATE_COLUMNS,
    WRITE_BATCH_FUNCTION,
    WRITE_BATCH_SIGNATURE,
)

# Every (table, privilege) the worker and the API use, as the connected role sees it.
# to_regclass is NULL for a table that is missing or in a schema the role may not use.
_TABLE_PRIVILEGES = text(
    """
    SELECT g.table_name, g.privilege, to_regclass(g.table_name) IS NOT NULL AS visible,
           coalesce(has_table_privilege(to_regclass(g.table_name), g.privilege), false) AS held
    FROM unnest(CAST(:tables AS text[]), CAST(:privileges AS text[])) AS g(table_name, privilege)
    """
)

# The columns the runtime role must be able to UPDATE, as it sees them.
_UPDATE_PRIVILEGES = text(
    """
    SELECT g.table_name, g.column_name, a.attname IS NOT NULL AS present,
           -- A column a later migration adds is not asked about: it would be an error.
           CASE WHEN a.attname IS NOT NULL
                THEN coalesce(has_column_privilege(to_regclass(g.table_name), g.column_name,
                                                   'UPDATE'), false)
                ELSE false END AS held
    FROM unnest(CAST(:tables AS text[]), CAST(:columns AS text[]))
         WITH ORDINALITY AS g(table_name, column_name, n)
    LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(g.table_name)
         AND a.attname = g.column_name AND a.attnum > 0 AND NOT a.attisdropped
    WHERE to_regclass(g.table_name) IS NOT NULL
    -- In the order declared: the lines check prints keep it.
    ORDER BY g.n
    """
)

# How a table's missing privileges are listed.
_PRIVILEGE_ORDER = ("SELECT", "INSERT", "UPDATE", "DELETE")


def unreachable_databases(settings: Settings) -> list[str]:
    """One line per configured database that does not answer `SELECT 1`."""
    problems = []
    for name, url in (
        ("DATABASE_URL", settings.database_url),
        ("MIGRATION_DATABASE_URL", settings.migration_database_url),
    ):
        if url:
            problem = connection_problem(url)
            if problem:
                problems.append(f"{name}: {problem}")
    return problems


def runtime_privilege_problems(settings: Settings) -> list[str]:
    """What the role in DATABASE_URL lacks for the worker and the API, one line per table.

    Without these the worker's every claim fails with a permission error: `check` is
    where an operator finds out before starting it.
    """
    engine = _engine(settings.database_url)
    try:
        with engine.connect() as connection:
            return _privilege_problems(connection)
    finally:
        engine.dispose()


def _privilege_problems(connection: Connection) -> list[str]:
    role = connection.execute(text("SELECT current_user")).scalar_one()
    pairs = [(table, p) for table, privileges in RUNTIME_GRANTS.items() for p in privileges]
    rows = connection.execute(
        _TABLE_PRIVILEGES,
        {"tables": [t for t, _ in pairs], "privileges": [p for _, p in pairs]},
    ).all()
    invisible = sorted({row.table_name for row in rows if not row.visible})
    lacking: dict[str, list[str]] = {}
    for row in rows:
        if row.visible and not row.held:
            lacking.setdefault(row.table_name, []).append(row.privilege)
    updates, absent = _lacking_updates(connection)
    for table, update in updates.items():
        lacking.setdefault(table, []).append(update)
    for privileges in lacking.values():
        privileges.sort(key=lambda p: _PRIVILEGE_ORDER.index(p.split(" ")[0]))
    problems: list[str] = []
    if invisible:
        problems.append(
            f"DATABASE_URL: role {role!r} sees no table {', '.join(invisible)} (not migrated, "
            "or no USAGE on their schema): run 'orquestador migrate' as the owner"
        )
    elif absent:
        # Tables there, columns of a later migration not: the same advice, one line.
        problems.append(
            f"DATABASE_URL: the database lacks column {', '.join(absent)} (older than this "
            "release): run 'orquestador migrate' as the owner"
        )
    if problems:
        # Behind this release: migrating also grants what a later revision added, so a
        # privilege missing now is no news (check again after migrating).
        return problems
    for table, privileges in lacking.items():
        problems.append(
            f"DATABASE_URL: role {role!r} lacks {', '.join(privileges)} on table {table}"
        )
    visible = list(RUNTIME_GRANTS)
    sequences = [
        sequence
        for sequence in serial_sequences(connection, visible)
        if not connection.execute(
            text("SELECT has_sequence_privilege(CAST(:s AS regclass), 'USAGE')"), {"s": sequence}
        ).scalar()
    ]
    for sequence in sequences:
        problems.append(f"DATABASE_URL: role {role!r} lacks USAGE on sequence {sequence}")
    functions = [
        signature
        for signature in RUNTIME_FUNCTIONS
        if function_present(connection, signature)
        and not connection.execute(
            text("SELECT has_function_privilege(:f, 'EXECUTE')"), {"f": signature}
        ).scalar()
    ]
    for signature in functions:
        problems.append(f"DATABASE_URL: role {role!r} lacks EXECUTE on function {signature}")
    if lacking or sequences or functions:
        problems.append(
            f"grant them as the owner: RUNTIME_DATABASE_ROLE={role} orquestador migrate grant"
        )
    problems += _temporary_problem(connection, role)
    # The tables are there but the worker's write function is not: the database is at a
    # revision older than this release (every worker write would fail).
    batch = connection.execute(
        text("SELECT to_regprocedure(:f) IS NOT NULL"), {"f": WRITE_BATCH_SIGNATURE}
    ).scalar_one()
    if not batch:
        problems.append(
            f"DATABASE_URL: function {WRITE_BATCH_FUNCTION} is missing: the database is "
            "older than this release; run 'orquestador migrate upgrade' as the owner"
        )
    return problems


def _temporary_problem(connection: Connection, role: str) -> list[str]:
    """The line for a runtime role that may create temporary tables, if it may: on a pooled
    connection such a table stands in for a product table in others' transactions."""
    database = connection.execute(text("SELECT current_database()")).scalar_one()
    if not connection.execute(
        text("SELECT has_database_privilege(current_database(), 'TEMPORARY')")
    ).scalar_one():
        return []
    quoted = connection.dialect.identifier_preparer.quote(database)
    return [
        f"DATABASE_URL: role {role!r} may create temporary tables in database {database!r}"
        " (TEMPORARY, PUBLIC's by default): on a pooled connection one can stand in for a"
        " product table in other clients' transactions; revoke it as the database's owner:"
        f" REVOKE TEMPORARY ON DATABASE {quoted} FROM PUBLIC ('orquestador migrate grant'"
        " does)"
    ]


def _lacking_updates(connection: Connection) -> tuple[dict[str, str], list[str]]:
    """Per table, the UPDATE the role lacks: "UPDATE" when it lacks every column it needs,
    else "UPDATE (the missing columns)"; and the columns not in the database at all
    ("table.column"), which no grant can give."""
    pairs = [(table, c) for table, columns in RUNTIME_UPDATE_COLUMNS.items() for c in columns]
    rows = connection.execute(
        _UPDATE_PRIVILEGES,
        {"tables": [t for t, _ in pairs], "columns": [c for _, c in pairs]},
    ).all()
    missing: dict[str, list[str]] = {}
    absent = [f"{row.table_name}.{row.column_name}" for row in rows if not row.present]
    for row in rows:
        if row.present and not row.held:
            missing.setdefault(row.table_name, []).append(row.column_name)
    return {
        table: "UPDATE"
        if len(columns) == len(RUNTIME_UPDATE_COLUMNS[table])
        else f"UPDATE ({', '.join(columns)})"
        for table, columns in missing.items()
    }, absent


def connection_problem(url: str) -> str | None:
    """Why URL does not answer `SELECT 1`, or None."""
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()
        return f"cannot connect: {reason[0] if reason else error}"
    finally:
        engine.dispose()
    return None


def _engine(url: str) -> Engine:
    return create_engine(
        sqlalchemy_url(url), poolclass=pool.NullPool, connect_args={"connect_timeout": 5}
    )
