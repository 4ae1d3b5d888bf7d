"""One way to get a test database: migrate a template once per process, clone it per test.

The server comes from ORQUESTADOR_TEST_DATABASE_URL when set, else a testcontainers
PostgreSQL when a Docker engine answers, else the embedded server in a temporary folder.
Under pytest-xdist every worker process migrates its own template; the embedded server
is one for the whole run (tests/shared_server.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from orquestador.config import sqlalchemy_url
from orquestador.db import migrate
from orquestador.db.embedded import memory_folder
from orquestador.db.engine import make_engine
from tests import shared_server
from tests.db_support import (
    RUNTIME_ROLE,
    TestDatabase,
    TestServer,
    create_database,
    drop_database,
    ensure_runtime_role,
)

log = logging.getLogger(__name__)

# Hypothesis fails an example slower than 200 ms by default: on a busy machine that is
# load, not a bug. Property tests bound their own work (sizes, steps) instead. The suite
# draws 50 examples per property (each run draws new ones); `deep` draws 1,000:
# ORQUESTADOR_HYPOTHESIS_PROFILE=deep pytest tests/unit.
hypothesis_settings.register_profile("suite", deadline=None, max_examples=50)
hypothesis_settings.register_profile("deep", deadline=None, max_examples=1000)
hypothesis_settings.load_profile(os.environ.get("ORQUESTADOR_HYPOTHESIS_PROFILE", "suite"))

TEMPLATE_PREFIX = "orquestador_template"
FOLDER_KEY = pytest.StashKey[Path]()
BASETEMP_KEY = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per CPU. A test mostly waits (on PostgreSQL, a subprocess, a
    socket): with one per CPU the run kept the CPUs less than half busy."""
    return 2 * len(os.sched_getaffinity(0))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker gets the same folder for the run's embedded server."""
    stash = node.config.stash
    if FOLDER_KEY not in stash:
        stash[FOLDER_KEY] = shared_server.new_folder()
    node.workerinput[shared_server.WORKER_INPUT_KEY] = str(stash[FOLDER_KEY])


def pytest_configure(config: pytest.Config) -> None:
    """tmp_path in memory where the system has room (unless --basetemp names a folder):
    the tests that start servers of their own (dev, the embedded server's tests) write
    their data folders there. xdist hands each worker a folder inside it."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    memory = memory_folder()
    if memory is not None:
        basetemp = memory / f"orq-tests-{uuid.uuid4().hex[:8]}"  # short: sockets live below it
        config.option.basetemp = str(basetemp)
        config.stash[BASETEMP_KEY] = basetemp


def pytest_unconfigure(config: pytest.Config) -> None:
    # Runs on the controller after every worker has finished.
    folder = config.stash.get(FOLDER_KEY, None)
    if folder is not None:
        shared_server.remove(folder)
    basetemp = config.stash.get(BASETEMP_KEY, None)
    if basetemp is not None:
        shutil.rmtree(basetemp, ignore_errors=True)  # memory, not a disk: nothing is kept


# The modules whose tests take longest, the longest first. A parallel run starts them
# before the rest, so that no worker is left with a 30-second test while the others have
# finished (with --maxschedchunk in pyproject.toml, a worker takes tests two at a time).
STARTED_FIRST = (
    "tests/promise/test_promise_short.py",
    "tests/ha/test_restart_connections.py",
    "tests/ha/test_failover.py",
    "tests/acceptance/test_docs_examples.py",
    "tests/acceptance/test_dev_command.py",
    "tests/acceptance/test_schedule_workers.py",
    "tests/integration/test_cli.py",
    "tests/acceptance/test_paused_holder.py",
    "tests/acceptance/test_slow_clients.py",
    "tests/integration/test_worker_stop_budget.py",
    "tests/integration/test_machines_cli.py",
    "tests/acceptance/test_operations_processes.py",
    "tests/browser/test_rollout_page_in_chromium.py",
    "tests/acceptance/test_agent_poll_capacity.py",
    "tests/integration/test_worker_daemon.py",
    "tests/acceptance/test_lookup_crash.py",
    "tests/acceptance/test_executions_cli.py",
    "tests/integration/test_agent_enrolled_process.py",
    "tests/integration/test_agent_process.py",
    "tests/integration/test_database_restart.py",
    "tests/acceptance/test_approval_crash.py",
    "tests/acceptance/test_dry_run_crash.py",
    "tests/acceptance/test_wait_crash.py",
    "tests/acceptance/test_bulk_crash.py",
    "tests/migration/test_first_install.py",
    "tests/acceptance/test_schedules_cli.py",
    "tests/acceptance/test_flows_cli.py",
    "tests/acceptance/test_bulk_cli.py",
    "tests/acceptance/test_api_fuzz.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0]
        if module in STARTED_FIRST:
            return (1, STARTED_FIRST.index(module))
        return (2, 0)

    items.sort(key=rank)  # stable: each module keeps its own order


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[TestServer]:
    external = os.environ.get("ORQUESTADOR_TEST_DATABASE_URL")
    if external:
        yield TestServer(sqlalchemy_url(external))
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18-alpine", driver="psycopg") as container:
            yield TestServer(make_url(container.get_connection_url()))
        return
    shared = getattr(request.config, "workerinput", {}).get(shared_server.WORKER_INPUT_KEY)
    if shared:
        # The controller stops it once every worker is done (pytest_unconfigure).
        yield TestServer(
            make_url(shared_server.shared_server(Path(shared)).url("postgres")), copies_files=True
        )
        return
    folder = shared_server.new_folder()
    server = shared_server.server_in(folder)
    try:
        server.start()
        yield TestServer(make_url(server.url("postgres")), copies_files=True)
    finally:
        shared_server.remove(folder)


@pytest.fixture(scope="session")
def template_database(pg_server: TestServer) -> Iterator[str]:
    """Migrated once per run (per worker under xdist); every test database is a copy of it."""
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


class Clones:
    """Copies of the template for the tests of one process, made one ahead and dropped
    after, on a thread of their own: a test waits for neither (each took about a
    quarter of a second, a third of the suite's time in setup and teardown)."""

    def __init__(self, server: TestServer, template: str) -> None:
        self._server = server
        self._template = template
        # A thread for the copy made ahead and one for the drops, so that a test never
        # waits for its copy behind the drops before it (a drop may wait on a checkpoint).
        self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-copies")
        self._dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-drops")
        self._next = self._make()

    def _make(self) -> Future[str]:
        return self._copier.submit(self._copy)

    def _copy(self) -> str:
        name = create_database(self._server, "orquestador_test", template=self._template)
        # A copy does not keep the template's database privileges: as `migrate` leaves a
        # database, no temporary table for the runtime role (grants.revoke_temporary).
        self._server.admin(f'REVOKE TEMPORARY ON DATABASE "{name}" FROM PUBLIC')
        return name

    def take(self) -> str:
        name = self._next.result()
        self._next = self._make()
        return name

    def give_back(self, name: str) -> None:
        self._dropper.submit(drop_database, self._server, name)

    def close(self) -> None:
        self.give_back(self._next.result())
        self._copier.shutdown(wait=True)
        self._dropper.shutdown(wait=True)


@pytest.fixture(scope="session")
def clones(pg_server: TestServer, template_database: str) -> Iterator[Clones]:
    made = Clones(pg_server, template_database)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def database(pg_server: TestServer, clones: Clones) -> Iterator[TestDatabase]:
    name = clones.take()
    try:
        yield TestDatabase(name, pg_server.url(name), pg_server.url(name, runtime=True))
    finally:
        clones.give_back(name)


@pytest.fixture(scope="module")
def module_database(pg_server: TestServer, clones: Clones) -> Iterator[TestDatabase]:
    """One database for a module's tests, for tests whose assertion holds whatever the
    earlier tests left (the fuzzers: never a 5xx): their setup is paid once per module."""
    name = clones.take()
    try:
        yield TestDatabase(name, pg_server.url(name), pg_server.url(name, runtime=True))
    finally:
        clones.give_back(name)


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
