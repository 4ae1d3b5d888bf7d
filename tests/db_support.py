"""Test databases: the server the tests use, the runtime role, databases made and dropped."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import URL

RUNTIME_ROLE = "orquestador_test_runtime"
RUNTIME_PASSWORD = "orquestador-test-runtime"


@dataclass(frozen=True)
class TestServer:
    """A PostgreSQL server the tests may create databases and roles on."""

    __test__ = False

    admin_url: URL  # a superuser (or CREATEDB + CREATEROLE) connection to a maintenance db
    # Copy a template file by file (PostgreSQL 15's STRATEGY FILE_COPY): about three times
    # faster than the default, which writes the copy through the WAL, but each copy asks
    # for a checkpoint: only for the embedded server, which runs with fsync off.
    copies_files: bool = False

    def url(self, database: str, *, runtime: bool = False) -> URL:
        if runtime:
            return self.admin_url.set(
                database=database, username=RUNTIME_ROLE, password=RUNTIME_PASSWORD
            )
        return self.admin_url.set(database=database)

    def admin(self, sql: str) -> None:
        engine = create_engine(
            self.admin_url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
        )
        try:
            with engine.connect() as connection:
                connection.execute(text(sql))
        finally:
            engine.dispose()


@dataclass(frozen=True)
class TestDatabase:
    """A fresh, migrated database for one test, owned by the server's admin user."""

    __test__ = False

    name: str
    owner_url: URL
    runtime_url: URL

    @property
    def runtime_dsn(self) -> str:
        return self.runtime_url.render_as_string(hide_password=False)

    @property
    def owner_dsn(self) -> str:
        return self.owner_url.render_as_string(hide_password=False)


def ensure_role(server: TestServer, role: str, password: str) -> None:
    """Create a login role once per server, however many test processes ask at the same time."""
    # Roles are server-wide: a parallel worker may create the same one between the check and
    # the CREATE, which then fails on the unique index (or as a duplicate) and is fine.
    server.admin(
        f"""DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                CREATE ROLE {role} LOGIN PASSWORD '{password}';
              END IF;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END $$"""
    )


def ensure_runtime_role(server: TestServer) -> None:
    ensure_role(server, RUNTIME_ROLE, RUNTIME_PASSWORD)


def create_database(server: TestServer, prefix: str, template: str | None = None) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clause = f" TEMPLATE {template}" if template else ""
    if template and server.copies_files:
        clause += " STRATEGY FILE_COPY"
    server.admin(f'CREATE DATABASE "{name}"{clause}')
    return name


def drop_database(server: TestServer, name: str) -> None:
    server.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
