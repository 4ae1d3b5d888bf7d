"""Grants of the runtime role: per table in the migrations, all of RUNTIME_GRANTS on demand."""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import Connection, text

from orquestador.db.schema import RUNTIME_GRANTS

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
    the role existed) and costs nothing when the grants are already there.
    """
    quote = connection.dialect.identifier_preparer.quote
    tables = present_tables(connection)
    for table in tables:
        privileges = ", ".join(RUNTIME_GRANTS[table])
        connection.execute(text(f"GRANT {privileges} ON TABLE {quote(table)} TO {quote(role)}"))
    for sequence in serial_sequences(connection, tables):
        connection.execute(text(f"GRANT USAGE ON SEQUENCE {sequence} TO {quote(role)}"))
    return tables


def serial_sequences(connection: Connection, tables: list[str]) -> list[str]:
    """Sequences (regclass text, quoted as needed) that serial columns of TABLES draw from."""
    if not tables:
        return []
    return list(connection.execute(_SERIAL_SEQUENCES, {"tables": tables}).scalars())
