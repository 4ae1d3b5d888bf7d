"""Grants of the runtime role, called by the migrations that create tables."""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import text

log = logging.getLogger("orquestador.migrations")


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
                " no table gets runtime grants"
            )
        return
    quoted = op.get_bind().dialect.identifier_preparer.quote(role)
    op.execute(text(f"GRANT {', '.join(privileges)} ON TABLE {table} TO {quoted}"))
