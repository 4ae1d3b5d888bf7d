"""One way to get a test database: migrate a template once per run, clone it per test.

The server comes from ORQUESTADOR_TEST_DATABASE_URL when set, else a testcontainers
PostgreSQL when a Docker engine answers, else the embedded server in a temporary folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from orquestador.config import sqlalchemy_url
from orquestador.db import migrate
from orquestador.db.engine import make_engine
from tests.db_support import (
    RUNTIME_ROLE,
    TestDatabase,
    TestServer,
    create_database,
    drop_database,
    ensure_runtime_role,
)

log = logging.getLogger(__name__)

TEMPLATE_PREFIX = "orquestador_template"


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


@pytest.fixture(scope="session")
def template_database(pg_server: TestServer) -> Iterator[str]:
    """Migrated once per run; every test database is a copy of it."""
    ensure_runtime_role(pg_server)
    name = create_database(pg_server, TEMPLATE_PREFIX)
    config = migrate.alembic_config(
        url=pg_server.url(name).render_as_string(hide_password=False), runtime_role=RUNTIME_ROLE
    )
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
