"""The worker through Debian's PgBouncer in transaction mode, LISTEN on a direct connection.

DB_PREPARE=false (PgBouncer before 1.21 forwards no prepared statement between server
connections); the maintenance lock and LISTEN use LISTEN_DATABASE_URL, the server itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from orquestador.actions import Effect
from orquestador.db.engine import make_engine
from orquestador.worker.daemon import Worker
from tests.db_support import TestDatabase
from tests.integration.worker_support import (
    RecordingAdapter,
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    registry_of,
    settings,
    wait_until,
)

pytestmark = pytest.mark.ha
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def bouncer(database: TestDatabase) -> Iterator[str]:
    """A runtime URL through a PgBouncer in transaction mode in front of the test server."""
    if not Path(PGBOUNCER).is_file():
        pytest.skip("pgbouncer is not installed (Debian's package `pgbouncer`)")
    url = database.runtime_url
    host = url.host or str(url.query.get("host", ""))
    folder = Path(tempfile.mkdtemp(prefix="orquestador-pgbouncer-"))
    folder.chmod(0o755)
    port = _free_port()
    (folder / "users.txt").write_text(f'"{url.username}" "{url.password}"\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database.name} = host={host} port={url.port or 5432} dbname={database.name}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 5\n"
        "ignore_startup_parameters = extra_float_digits, options\n"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    log = (folder / "pgbouncer.log").open("wb")  # its log goes to stderr, kept here
    # PgBouncer refuses to run as root; -u hands it to an ordinary account.
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command[1:1] = ["-u", "nobody"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_until(answers, timeout=10, what="pgbouncer to listen")
        yield url.set(host="127.0.0.1", port=port, query={}).render_as_string(hide_password=False)
    finally:
        process.kill()
        process.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_executions_complete_through_pgbouncer_in_transaction_mode(
    bouncer: str, database: TestDatabase, owner_engine: object
) -> None:
    engine = make_engine(bouncer, pool_size=4, prepare=False)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT current_database()")).scalar_one() == database.name
    writer = RecordingAdapter("test.write", Effect.IDEMPOTENT_WRITE)
    flow_id = publish_flow(engine, flow_definition([action("w", "test.write")]))
    worker_settings = settings(
        database_url=bouncer,
        listen_database_url=database.runtime_dsn,
        db_prepare=False,
        db_pool_size=4,
    )
    worker = Worker(worker_settings, engine, registry_of(writer))
    worker.start()
    try:
        wait_until(worker.listener.listening.is_set, timeout=15, what="LISTEN, direct")
        requests = [create_request(engine, flow_id) for _ in range(20)]
        for request_id in requests:
            accept_transition(engine, request_id)

        def finished() -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT count(*) FROM execution WHERE status = 'SUCCEEDED'")
                    ).scalar_one()
                )

        wait_until(lambda: finished() == 20, timeout=60, what="every execution to succeed")
    finally:
        worker.stop(30)
        engine.dispose()
