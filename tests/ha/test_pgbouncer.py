"""The API and a worker through Debian's PgBouncer in transaction mode, session state direct.

gunicorn (`orquestador api`) and `orquestador worker` run on a DATABASE_URL through
PgBouncer with `pool_mode = transaction` and DB_PREPARE=false (PgBouncer before 1.21
forwards no prepared statement between server connections). The worker's LISTEN and its
maintenance lock are session state: they use LISTEN_DATABASE_URL, the server itself. A
thread creates requests and accepts transitions over HTTP; every acceptance must run to
SUCCEEDED, no answer may be a 5xx, the listener's and the leader's backends must be none
of PgBouncer's server connections, and with polling set to a minute every execution must
start within seconds of its acceptance: only a NOTIFY that reached the worker does that.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from orquestador.config import libpq_url
from orquestador.db import migrate
from orquestador.db.engine import make_engine
from tests.db_support import RUNTIME_ROLE, TestDatabase
from tests.ha.api_traffic import ROOT, serve_api, spawn, traffic_through
from tests.ha.replication import free_port, poll

pytestmark = pytest.mark.ha
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
JWT_SECRET = "pgbouncer-test-signing-key-0123456789"
# Far longer than the test waits for any execution: a worker that starts work within
# seconds of its acceptance was woken by a NOTIFY, not by its poll.
POLL_MS = 60_000
FLOW = {
    "key": "bouncer-nothing",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "finish", "from": ["new"], "to": "done", "actions": []}],
}


@dataclass(frozen=True)
class Bouncer:
    url: str  # the runtime role's URL through PgBouncer
    admin: str  # PgBouncer's admin console

    def url_for_psycopg(self) -> str:
        return libpq_url(self.url)

    def server_ports(self) -> set[int]:
        """Local ports of PgBouncer's connections to the server (SHOW SERVERS)."""
        # The admin console speaks only the simple query protocol: a client-side cursor.
        with (
            psycopg.connect(self.admin, autocommit=True) as conn,
            psycopg.ClientCursor(conn) as cursor,
        ):
            cursor.execute("SHOW SERVERS")
            assert cursor.description is not None
            column = [c.name for c in cursor.description].index("local_port")
            return {int(row[column]) for row in cursor.fetchall()}


@pytest.fixture
def bouncer(database: TestDatabase) -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode in front of the test server, for the runtime role."""
    with running_bouncer(database, pool_size=5) as started:
        yield started


# OPERATIONS.md's auth_file line for a role: the very SCRAM secret the server keeps.
AUTH_FILE_LINE = text(
    'SELECT format(\'"%s" "%s"\', rolname, rolpassword) FROM pg_authid WHERE rolname = :role'
)


@contextmanager
def running_bouncer(
    database: TestDatabase, pool_size: int, *, scram: bool = False
) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode, POOL_SIZE server connections for the runtime role;
    `scram`: clients checked against the auth_file OPERATIONS.md says to write."""
    if not Path(PGBOUNCER).is_file():
        pytest.skip("pgbouncer is not installed (Debian's package `pgbouncer`)")
    url = database.runtime_url
    host = url.host or str(url.query.get("host", ""))
    folder = Path(tempfile.mkdtemp(prefix="orquestador-pgbouncer-"))
    folder.chmod(0o755)
    port = free_port()
    users = f'"{url.username}" "{url.password}"'
    if scram:
        owner = make_engine(database.owner_dsn, pool_size=1)
        with owner.connect() as conn:
            users = conn.execute(AUTH_FILE_LINE, {"role": url.username}).scalar_one()
        owner.dispose()
    (folder / "users.txt").write_text(f"{users}\n")
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database.name} = host={host} port={url.port or 5432} dbname={database.name}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = {'scram-sha-256' if scram else 'trust'}\n"
        f"auth_file = {folder / 'users.txt'}\n"
        f"admin_users = {url.username}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\n"
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

        poll(answers, timeout=10, what="pgbouncer to listen")
        through = url.set(host="127.0.0.1", port=port, query={})
        yield Bouncer(
            through.render_as_string(hide_password=False),
            libpq_url(through.set(database="pgbouncer")),
        )
    finally:
        process.kill()
        process.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _session(database: TestDatabase, application_name: str, query: str) -> list[tuple]:
    """(client_port, query) of the database's backends of that name; `query` adds a filter."""
    engine = make_engine(database.owner_dsn, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT a.client_port, a.query FROM pg_stat_activity a"
                    " WHERE a.datname = current_database() AND a.application_name = :name"
                    f" AND {query}"
                ),
                {"name": application_name},
            )
            return [tuple(row) for row in rows]
    finally:
        engine.dispose()


def test_the_api_and_a_worker_work_through_pgbouncer_with_session_state_direct(
    bouncer: Bouncer,
    database: TestDatabase,
    started: list[subprocess.Popen],
    tmp_path: Path,
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PG")},
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": bouncer.url,
        "LISTEN_DATABASE_URL": database.runtime_dsn,
        "DB_PREPARE": "false",
        "DB_POOL_SIZE": "4",
        "JWT_SECRET": JWT_SECRET,
        "LOG_LEVEL": "WARNING",
    }
    base = serve_api(started, env, tmp_path / "api.log", workers=2, threads=4)
    spawn(
        started,
        "worker",
        {
            **env,
            "WORKER_ENABLED": "true",
            "WORKER_CONCURRENCY": "4",
            "WORKER_POLL_MS": str(POLL_MS),
            "MAINTENANCE_INTERVAL_SECONDS": "1",
        },
        tmp_path / "worker.log",
    )

    # Listening before any acceptance, so that every one of them can wake the worker.
    poll(
        lambda: _session(database, "orquestador-listener", "a.query LIKE 'LISTEN %'"),
        timeout=60,
        what="the worker's LISTEN",
    )

    traffic = traffic_through(base, JWT_SECRET, FLOW, "finish")

    sender = threading.Thread(target=traffic.run, name="api-traffic", daemon=True)
    sender.start()
    try:
        poll(lambda: len(traffic.accepted) >= 30, timeout=60, what="30 acceptances")
    finally:
        traffic.stop.set()
        sender.join(60)
    acknowledged = {execution for _, execution in traffic.accepted}

    def settled() -> dict[str, tuple[str, float | None]] | None:
        """Each execution's status and seconds from its acceptance to its start."""
        with owner.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id::text, status, extract(epoch FROM started_at - created_at)"
                    " FROM execution"
                )
            )
            found = {e: (s, None if w is None else float(w)) for e, s, w in rows}
        done = all(found.get(e, ("",))[0] == "SUCCEEDED" for e in acknowledged)
        return found if done else None

    owner = make_engine(database.owner_dsn, pool_size=1)
    try:
        # A third of one poll: only NOTIFYs can have woken the worker for all of them.
        ended = poll(settled, timeout=POLL_MS / 1000 / 3, what="every acceptance to succeed")
    finally:
        owner.dispose()

    # The worker's session state, each on a backend of its own that PgBouncer did not open.
    # Every backend of that name: one PgBouncer opened for a LISTEN sent through it counts.
    listener = _session(database, "orquestador-listener", "TRUE")
    leader = poll(
        lambda: _session(
            database,
            "orquestador-maintenance",
            "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid"
            " AND l.locktype = 'advisory' AND l.granted)",
        ),
        timeout=30,
        what="the maintenance leader's lock",
    )
    through_bouncer = bouncer.server_ports()
    by_status = Counter(answer.status for answer in traffic.answers)
    waits = [wait for execution, (_, wait) in ended.items() if execution in acknowledged]
    print(
        f"\npgbouncer: {len(acknowledged)} acknowledged, answers {dict(by_status)}, "
        f"acceptance to start at most {max(w or 0.0 for w in waits):.3f} s; "
        f"listener port {listener}, leader port {leader}, PgBouncer's {sorted(through_bouncer)}"
    )
    assert set(by_status) <= {201, 202}, by_status
    assert all(status == "SUCCEEDED" for status, _ in ended.values()), Counter(ended.values())
    assert all(wait is not None and wait < 5 for wait in waits), waits
    assert through_bouncer, "PgBouncer holds no server connection: the product bypassed it"
    assert len(listener) == 1 and listener[0][0] not in through_bouncer, listener
    assert len(leader) == 1 and leader[0][0] not in through_bouncer, leader


def test_a_temporary_table_cannot_swallow_the_apis_audit_rows_on_a_pooled_connection(
    database: TestDatabase, started: list[subprocess.Popen], tmp_path: Path
) -> None:
    # The database as `orquestador migrate grant` leaves it, PUBLIC's default given back
    # first (a test database is a copy, which keeps no database privileges).
    owner = make_engine(database.owner_dsn, pool_size=1)
    with owner.begin() as conn:
        conn.execute(text(f'GRANT TEMPORARY ON DATABASE "{database.name}" TO PUBLIC'))
    migrate.grant_runtime_role(database.owner_dsn, RUNTIME_ROLE, platform_role="")
    with running_bouncer(database, pool_size=1) as bouncer:
        # One server connection behind PgBouncer: whatever a client leaves in its session
        # meets every later transaction, another tenant's included.
        refused: Exception | None = None
        with psycopg.connect(bouncer.url_for_psycopg(), autocommit=True) as attacker:
            try:
                attacker.execute(
                    "CREATE TEMPORARY TABLE audit_event (id bigint, org_id text, kind text,"
                    " request_id uuid, execution_id uuid, actor text, detail jsonb,"
                    " created_at timestamptz)"
                )
            except psycopg.errors.InsufficientPrivilege as error:
                refused = error
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PG")},
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": bouncer.url,
            "DB_PREPARE": "false",
            "DB_POOL_SIZE": "1",
            "JWT_SECRET": JWT_SECRET,
            "LOG_LEVEL": "WARNING",
        }
        base = serve_api(started, env, tmp_path / "api.log", workers=1, threads=2)
        traffic = traffic_through(base, JWT_SECRET, FLOW, "finish")
        created = traffic.call("requests", {"flowId": traffic.flow_id, "data": {}})
        accepted = traffic.call(
            f"requests/{created.body['id']}/transitions",
            {"transition": "finish", "expectedRevision": created.body["revision"]},
        )
    assert accepted.status == 202, accepted.body
    with owner.connect() as conn:
        kinds = conn.execute(
            text("SELECT kind FROM audit_event WHERE execution_id = :id"),
            {"id": accepted.body["executionId"]},
        ).scalars()
        assert list(kinds) == ["TRANSITION_ACCEPTED"]
    owner.dispose()
    assert refused is not None, "the runtime role made a temporary audit_event"


def test_the_documented_auth_file_admits_the_runtime_role_with_its_password_only(
    database: TestDatabase,
) -> None:
    with running_bouncer(database, pool_size=1, scram=True) as bouncer:
        with psycopg.connect(bouncer.url_for_psycopg()) as connection:
            assert connection.execute("SELECT current_user").fetchone() == (RUNTIME_ROLE,)
        wrong = libpq_url(make_url(bouncer.url).set(password="not-the-password"))
        with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
            psycopg.connect(wrong).close()
