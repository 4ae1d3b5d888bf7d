"""Grants of the runtime role (per table in the migrations, all on demand) and the platform role."""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import Connection, text

from orquestador.db.schema import (
    PURGE_SIMULATIONS_SIGNATURE,
    RUNTIME_FUNCTIONS,
    RUNTIME_GRANTS,
    RUNTIME_UPDATE_COLUMNS,
)

log = logging.getLogger("orquestador.migrations")

# Sequences behind serial columns of the granted tables; identity columns need no grant.
_SERIAL_SEQUENCES = text(
    """
    SELECT s.oid::regclass::text
    FROM pg_class s
    JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid
                    AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'a'
    WHERE s.relkind = 'S' AND d.refobjid = ANY(CAST(:tables AS regclass[]))
    ORDER BY 1
    """
)


def runtime_role() -> str | None:
    return op.get_context().config.attributes.get("runtime_role") or None


def grant_runtime(table: str, privileges: tuple[str, ...]) -> None:
    """Give the runtime role exactly these privileges on one table (DML only, never DDL)."""
    role = runtime_role()
    if role is None:
        attributes = op.get_context().config.attributes
        if not attributes.get("warned_no_runtime_role"):
            attributes["warned_no_runtime_role"] = True
            log.warning(
                "no runtime role (RUNTIME_DATABASE_ROLE, or the user in DATABASE_URL):"
                " no table gets runtime grants; grant them later with"
                " 'orquestador migrate grant'"
            )
        return
    quoted = op.get_bind().dialect.identifier_preparer.quote(role)
    op.execute(text(f"GRANT {', '.join(privileges)} ON TABLE {table} TO {quoted}"))


def present_tables(connection: Connection) -> list[str]:
    """The tables of RUNTIME_GRANTS that exist in this database (by search_path)."""
    return [
        table
        for table in RUNTIME_GRANTS
        if connection.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is not None
    ]


def apply_runtime_grants(connection: Connection, role: str) -> list[str]:
    """GRANT RUNTIME_GRANTS to ROLE on every such table present; return those tables.

    GRANT is idempotent, so this repairs a database migrated without the role (or before
    the role existed) and costs nothing when the grants are already there. UPDATE is
    left column by column (RUNTIME_UPDATE_COLUMNS), whatever the role held before.
    """
    quote = connection.dialect.identifier_preparer.quote
    tables = present_tables(connection)
    for table in tables:
        privileges = ", ".join(RUNTIME_GRANTS[table])
        connection.execute(text(f"GRANT {privileges} ON TABLE {quote(table)} TO {quote(role)}"))
        restrict_updates(connection, role, table, RUNTIME_UPDATE_COLUMNS.get(table, ()))
    for sequence in serial_sequences(connection, tables):
        connection.execute(text(f"GRANT USAGE ON SEQUENCE {sequence} TO {quote(role)}"))
    for signature in RUNTIME_FUNCTIONS:
        if function_present(connection, signature):
            connection.execute(text(f"GRANT EXECUTE ON FUNCTION {signature} TO {quote(role)}"))
    return tables


def revoke_temporary(connection: Connection, role: str) -> bool:
    """Take TEMPORARY on this database from PUBLIC and from ROLE; whether ROLE lost it.

    PUBLIC may create temporary tables by default, and a temporary table comes first in
    the search path for tables: on a pooled connection (PgBouncer in transaction mode)
    one made by any client of the runtime role would stand in for a product table in
    every later transaction of that server connection, whoever's (an `audit_event` of
    its own swallowed other tenants' acceptance rows). The product makes none. Only the
    database's owner (or a superuser) can revoke it: for anyone else REVOKE changes
    nothing, which the answer and a warning say.
    """
    quote = connection.dialect.identifier_preparer.quote
    database = connection.execute(text("SELECT current_database()")).scalar_one()
    for grantee in ("PUBLIC", quote(role)):
        connection.execute(text(f"REVOKE TEMPORARY ON DATABASE {quote(database)} FROM {grantee}"))
    held = connection.execute(
        text("SELECT has_database_privilege(:role, current_database(), 'TEMPORARY')"),
        {"role": role},
    ).scalar_one()
    if held:
        log.warning(
            "role %r may still create temporary tables in database %r (it owns it, is a"
            " superuser, or this role does not own the database): as the database's owner,"
            " REVOKE TEMPORARY ON DATABASE %s FROM PUBLIC",
            role,
            database,
            quote(database),
        )
    return not held


def restrict_updates(
    connection: Connection, role: str, table: str, columns: tuple[str, ...]
) -> None:
    """Leave ROLE UPDATE on exactly COLUMNS of TABLE (none: no UPDATE at all).

    Revoking the table's UPDATE also revokes every column's, so a role once given the
    whole table (before migration 0012, or by hand) keeps only the listed columns. A role
    that owns the table (a development database migrated by its runtime role) is left
    alone: an owner revoking its own rights would lock itself out.
    """
    if owns(connection, role, table):
        return
    quote = connection.dialect.identifier_preparer.quote
    connection.execute(text(f"REVOKE UPDATE ON TABLE {quote(table)} FROM {quote(role)}"))
    if columns:
        listed = ", ".join(quote(column) for column in columns)
        connection.execute(
            text(f"GRANT UPDATE ({listed}) ON TABLE {quote(table)} TO {quote(role)}")
        )


def owns(connection: Connection, role: str, table: str) -> bool:
    """Whether ROLE owns TABLE, directly or through a role it belongs to."""
    return bool(
        connection.execute(
            text(
                "SELECT pg_has_role(:role, c.relowner, 'MEMBER')"
                " FROM pg_class c WHERE c.oid = CAST(:table AS regclass)"
            ),
            {"role": role, "table": table},
        ).scalar()
    )


def function_present(connection: Connection, signature: str) -> bool:
    """Whether the function of this signature exists in this database."""
    found = connection.execute(text("SELECT to_regprocedure(:f)"), {"f": signature}).scalar()
    return found is not None


def purge_function_present(connection: Connection) -> bool:
    """Whether migration 0009's purge function exists in this database."""
    return function_present(connection, PURGE_SIMULATIONS_SIGNATURE)


# The platform's own role may only append events to its transactional outbox: it never
# reads them back (its ids are its own) nor touches anything else of the product. It
# inserts the event's own columns only; received_at and the processing columns
# (processed_at, outcome, request_id, execution_id) are the product's, so an event
# cannot arrive already marked processed.
PLATFORM_INSERT_COLUMNS: dict[str, tuple[str, ...]] = {
    "platform_event": ("org_id", "id", "moment", "plan_id", "machine_id", "occurred_at", "data"),
}


class PlatformRoleIsRuntimeRole(ValueError):
    """PLATFORM_DATABASE_ROLE names the runtime role; give the platform a role of its own."""


def apply_platform_grants(connection: Connection, role: str, runtime_role: str | None) -> None:
    """Leave ROLE exactly PLATFORM_INSERT_COLUMNS on the product's tables: revoke, then grant.

    Revoking first makes a second run repair a role that was once given more. The runtime
    role is refused: revoking its privileges would stop the product.
    """
    if role == runtime_role:
        raise PlatformRoleIsRuntimeRole(PlatformRoleIsRuntimeRole.__doc__)
    quote = connection.dialect.identifier_preparer.quote
    # REVOKE ALL on a table takes its column privileges with it.
    for table in present_tables(connection):
        connection.execute(text(f"REVOKE ALL ON TABLE {quote(table)} FROM {quote(role)}"))
    for signature in RUNTIME_FUNCTIONS:
        if function_present(connection, signature):
            connection.execute(text(f"REVOKE ALL ON FUNCTION {signature} FROM {quote(role)}"))
    for table, columns in PLATFORM_INSERT_COLUMNS.items():
        listed = ", ".join(quote(column) for column in columns)
        connection.execute(
            text(f"GRANT INSERT ({listed}) ON TABLE {quote(table)} TO {quote(role)}")
        )
    log.info(
        "platform role %r: %s",
        role,
        "; ".join(f"INSERT ({', '.join(c)}) on {t}" for t, c in PLATFORM_INSERT_COLUMNS.items()),
    )


def serial_sequences(connection: Connection, tables: list[str]) -> list[str]:
    """Sequences (regclass text, quoted as needed) that serial columns of TABLES draw from."""
    if not tables:
        return []
    return list(connection.execute(_SERIAL_SEQUENCES, {"tables": tables}).scalars())
