"""One way to get a test database: migrate a template once per run, clone it per test.

The server comes from ORQUESTADOR_TEST_DATABASE_URL when set, else a testcontainers
PostgreSQL when a Docker engine answers, else the embedded server in a temporary folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import URL, make_url

from orquestador.config import sqlalchemy_url
from orquestador.db import migrate
from orquestador.db.engine import make_engine

log = logging.getLogger(__name__)

RUNTIME_ROLE = "orquestador_test_runtime"
RUNTIME_PASSWORD = "orquestador-test-runtime"
TEMPLATE_PREFIX = "orquestador_template"


@dataclass(frozen=True)
class TestServer:
    """A PostgreSQL server the tests may create databases and roles on."""

    admin_url: URL  # a superuser (or CREATEDB + CREATEROLE) connection to a maintenance db

    def url(self, database: str, *, runtime: bool = False) -> URL:
        if runtime:
            return self.admin_url.set(
                database=database, username=RUNTIME_ROLE, password=RUNTIME_PASSWORD
            )
        return self.admin_url.set(database=database)

    def admin(self, sql: str) -> None:
        engine = create_engine(self.admin_url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(sql))
        finally:
            engine.dispose()


@dataclass(frozen=True)
class TestDatabase:
    """A fresh, migrated database for one test, owned by the server's admin user."""

    name: str
    owner_url: URL
    runtime_url: URL

    @property
    def runtime_dsn(self) -> str:
        return self.runtime_url.render_as_string(hide_password=False)

    @property
    def owner_dsn(self) -> str:
        return self.owner_url.render_as_string(hide_password=False)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    external = os.environ.get("ORQUESTADOR_TEST_DATABASE_URL")
    if external:
        yield TestServer(sqlalchemy_url(external))
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18-alpine", driver="psycopg") as container:
            yield TestServer(make_url(container.get_connection_url()))
        return
    from orquestador.db.embedded import EmbeddedPostgres

    folder = Path(tempfile.mkdtemp(prefix="orquestador-test-pg-"))
    folder.chmod(0o755)
    server = EmbeddedPostgres(folder / "pgdata", fsync=False)
    server.start()
    try:
        yield TestServer(make_url(server.url("postgres")))
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def ensure_runtime_role(server: TestServer) -> None:
    server.admin(
        f"""DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{RUNTIME_ROLE}') THEN
                CREATE ROLE {RUNTIME_ROLE} LOGIN PASSWORD '{RUNTIME_PASSWORD}';
              END IF;
            END $$"""
    )


def create_database(server: TestServer, prefix: str, template: str | None = None) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clause = f" TEMPLATE {template}" if template else ""
    server.admin(f'CREATE DATABASE "{name}"{clause}')
    return name


def drop_database(server: TestServer, name: str) -> None:
    server.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_database(pg_server: TestServer) -> Iterator[str]:
    """Migrated once per run; every test database is a copy of it."""
    ensure_runtime_role(pg_server)
    name = create_database(pg_server, TEMPLATE_PREFIX)
    config = migrate.alembic_config(url=pg_server.url(name).render_as_string(hide_password=False),
                                    runtime_role=RUNTIME_ROLE)
    migrate.upgrade(config)
    try:
        yield name
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def database(pg_server: TestServer, template_database: str) -> Iterator[TestDatabase]:
    name = create_database(pg_server, "orquestador_test", template=template_database)
    try:
        yield TestDatabase(name, pg_server.url(name), pg_server.url(name, runtime=True))
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def runtime_engine(database: TestDatabase) -> Iterator[Engine]:
    """An engine on the restricted runtime role, as the product connects."""
    engine = make_engine(database.runtime_dsn, pool_size=10, max_overflow=20)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def owner_engine(database: TestDatabase) -> Iterator[Engine]:
    """An engine on the owner role, for arranging fixtures a runtime role may not write."""
    engine = make_engine(database.owner_dsn)
    try:
        yield engine
    finally:
        engine.dispose()
