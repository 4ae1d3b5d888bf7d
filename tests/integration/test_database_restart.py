"""PostgreSQL restarts (`pg_ctl -m immediate`) under a running worker and API.

The test owns a throwaway server: it stops it mid-workload, checks that the API answers
503 problems (readiness and a real route) while it is away, starts it again, and checks
that every execution still ends, exactly once (one TRANSITION_COMPLETED each), and that
the listener, the heartbeat, the scheduler and the background loops recovered.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from orquestador.actions import ActionContext, Effect
from orquestador.api.app import create_app
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.db import migrate
from orquestador.db.embedded import EmbeddedPostgres
from orquestador.db.engine import make_engine
from orquestador.serve import serve_in_thread
from orquestador.worker.daemon import Worker
from tests.integration.worker_support import (
    ORG,
    OWNER,
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

RUNTIME_ROLE = "orquestador_restart_runtime"
DATABASE = "orquestador_restart"
EXECUTIONS = 40
JWT_SECRET = "restart-test-signing-key-0123456789"
SCOPES = ["requests:read", "requests:write", "flows:admin", "executions:reconcile"]


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    folder = Path(tempfile.mkdtemp(prefix="orquestador-restart-"))
    folder.chmod(0o755)
    server = EmbeddedPostgres(folder / "pgdata", fsync=False)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def _prepare(server: EmbeddedPostgres) -> tuple[str, str]:
    """A migrated database and its runtime role; (owner URL, runtime URL)."""
    admin = make_engine(server.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE {RUNTIME_ROLE} LOGIN"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    admin.dispose()
    owner_url = server.url(DATABASE)
    migrate.upgrade(migrate.alembic_config(url=owner_url, runtime_role=RUNTIME_ROLE))
    return owner_url, server.url(DATABASE, user=RUNTIME_ROLE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", "")


def _call(method: str, url: str, token: str, body: Any = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", "")


def test_everything_survives_an_immediate_database_restart(server: EmbeddedPostgres) -> None:
    owner_url, runtime_url = _prepare(server)
    engine = make_engine(runtime_url, pool_size=8, ping_after_idle_seconds=1)
    owner = make_engine(owner_url)
    ledger: dict[str, int] = {}
    ledger_lock = threading.Lock()
    gate = threading.Event()  # set: the adapter answers; clear: it holds a few calls back

    def read(ctx: ActionContext) -> dict[str, Any]:
        gate.wait(2.5)
        time.sleep(0.02)
        with ledger_lock:
            ledger[ctx.external_key] = ledger.get(ctx.external_key, 0) + 1
        return {"ok": True}

    reader = RecordingAdapter(
        "test.read", Effect.READ_ONLY, output=read, max_attempts=10, timeout_seconds=3
    )
    flow_id = publish_flow(owner, flow_definition([action("r", "test.read")]))
    requests = [create_request(owner, flow_id) for _ in range(EXECUTIONS)]
    executions = [accept_transition(owner, request_id) for request_id in requests]

    worker_settings = settings(
        database_url=runtime_url,
        worker_lease_seconds=6,
        worker_renew_seconds=2,
        worker_poll_ms=100,
        maintenance_interval_seconds=1,
        worker_metrics_port=str(_free_port()),
    )
    worker = Worker(worker_settings, engine, registry_of(reader))
    api_settings = Settings.from_env(
        {},
        database_url=runtime_url,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret=JWT_SECRET,
    )
    app = create_app(api_settings, registry=registry_of(reader))
    http, _ = serve_in_thread(app, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{http.server_port}"
    token = mint_token(api_settings, sub=OWNER, org=ORG, scopes=SCOPES, ttl_seconds=600)
    one = f"{base}/api/v1/executions/{executions[0]}"
    worker_ready = f"http://127.0.0.1:{worker_settings.worker_metrics_port}/readyz"

    def finished() -> int:
        with owner.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM execution WHERE finished_at IS NOT NULL")
                ).scalar_one()
            )

    gate.set()
    worker.start()
    try:
        assert _status(f"{base}/readyz")[0] == 200
        wait_until(lambda: finished() >= 8, timeout=60, what="some executions to finish")
        wait_until(worker.listener.listening.is_set, timeout=10, what="the listener")
        wait_until(lambda: worker.maintenance.passes >= 1, timeout=10, what="a maintenance pass")
        wait_until(lambda: _status(worker_ready)[0] == 200, timeout=30, what="the worker ready")
        gate.clear()  # calls in flight when the server goes away
        time.sleep(0.3)

        server.stop("immediate")
        outage_started = time.monotonic()
        status, content_type = _status(f"{base}/readyz")
        assert status == 503 and content_type.startswith("application/problem+json")
        status, content_type = _status(one, token)
        assert status == 503 and content_type.startswith("application/problem+json")
        # Reads and writes of every kind: a problem saying the database is away, never 500.
        request_id = requests[0]
        calls: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", "/api/v1/executions", None),
            ("GET", f"/api/v1/executions/{executions[0]}/evidence", None),
            ("GET", f"/api/v1/requests/{request_id}", None),
            ("GET", "/api/v1/flows", None),
            ("POST", "/api/v1/requests", {"flowId": str(flow_id), "data": {}}),
            (
                "POST",
                f"/api/v1/requests/{request_id}/transitions",
                {"transition": "go", "expectedRevision": 2},
            ),
        ]
        for method, path, body in calls:
            status, content_type = _call(method, f"{base}{path}", token, body)
            assert (status, content_type.split(";")[0]) == (503, "application/problem+json"), (
                method,
                path,
            )
        wait_until(
            lambda: not worker.listener.listening.is_set(),
            timeout=10,
            what="the listener to notice",
        )
        # The worker's readiness names what is failing while the server is away.
        wait_until(lambda: _status(worker_ready)[0] == 503, timeout=10, what="the worker unready")
        passes_before = worker.maintenance.passes
        time.sleep(max(0.0, 2.0 - (time.monotonic() - outage_started)))
        server.start()
        gate.set()

        wait_until(lambda: _status(f"{base}/readyz")[0] == 200, timeout=30, what="readiness")
        assert _status(one, token)[0] == 200
        wait_until(lambda: finished() == EXECUTIONS, timeout=120, what="every execution to finish")
        wait_until(worker.listener.listening.is_set, timeout=30, what="the listener again")
        wait_until(
            lambda: worker.maintenance.passes > passes_before,
            timeout=30,
            what="maintenance after the restart",
        )
        for loop in worker.loops:
            wait_until(loop.healthy.is_set, timeout=30, what=f"{loop.name} to recover")
        assert worker.scheduler.is_alive() and worker.heartbeat.is_alive()
        wait_until(lambda: _status(worker_ready)[0] == 200, timeout=30, what="the worker ready")
    finally:
        gate.set()
        worker.stop(30)
        http.shutdown()
        app.extensions["orquestador"].engine.dispose()

    with owner.connect() as conn:
        statuses = dict(
            conn.execute(text("SELECT status, count(*) FROM execution GROUP BY status")).all()
        )
        completions = dict(
            conn.execute(
                text(
                    "SELECT execution_id, count(*) FROM audit_event"
                    " WHERE kind = 'TRANSITION_COMPLETED' GROUP BY execution_id"
                )
            ).all()
        )
    engine.dispose()
    owner.dispose()
    assert statuses == {"SUCCEEDED": EXECUTIONS}
    # Each ended once: one completion each, and each action answered at least once.
    assert completions == {execution_id: 1 for execution_id in executions}
    assert set(ledger) == {f"{execution_id}:r" for execution_id in executions}
