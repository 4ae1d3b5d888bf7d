"""The local database of `orquestador dev`: an embedded server with an owner and a runtime role."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, pool, text

from orquestador.config import sqlalchemy_url
from orquestador.db.embedded import EmbeddedPostgres

log = logging.getLogger(__name__)

DATABASE_NAME = "orquestador"
OWNER_ROLE = "postgres"
RUNTIME_ROLE = "orquestador_runtime"


@dataclass(frozen=True)
class LocalDatabase:
    """URLs of the embedded server: the owner migrates, the runtime role does the rest."""

    server: EmbeddedPostgres
    migration_url: str
    runtime_url: str
    runtime_role: str = RUNTIME_ROLE


def start_local_database(home: Path) -> LocalDatabase:
    """Start (or reuse) the server under HOME/pgdata and make sure the database and roles exist."""
    server = EmbeddedPostgres(home.resolve() / "pgdata", superuser=OWNER_ROLE)
    server.start()
    admin = create_engine(
        sqlalchemy_url(server.url("postgres", user=OWNER_ROLE)),
        poolclass=pool.NullPool,
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as connection:
            if not connection.execute(
                text("SELECT 1 FROM pg_roles WHERE rolname = :role"), {"role": RUNTIME_ROLE}
            ).first():
                # Unix socket only, trust auth: the runtime role needs no password here.
                connection.execute(text(f"CREATE ROLE {RUNTIME_ROLE} LOGIN"))
            if not connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": DATABASE_NAME}
            ).first():
                connection.execute(text(f"CREATE DATABASE {DATABASE_NAME} OWNER {OWNER_ROLE}"))
    finally:
        admin.dispose()
    return LocalDatabase(
        server=server,
        migration_url=plain_url(server.url(DATABASE_NAME, user=OWNER_ROLE)),
        runtime_url=plain_url(server.url(DATABASE_NAME, user=RUNTIME_ROLE)),
    )


def plain_url(url: str) -> str:
    """The form a person pastes into DATABASE_URL (any postgresql:// driver suffix dropped)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
