"""`orquestador dev`: embedded database, migrations, worker and API in one process."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from orquestador.config import Settings
from orquestador.db import migrate
from orquestador.dev_address import forget_dev_api, loopback_url, record_dev_api

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer

log = logging.getLogger(__name__)

# The same caller as the token examples in docs/API.md, so what one publishes the other sees.
DEV_SUBJECT = "alice"
DEV_ORG = "acme"
DEV_SCOPES = [
    "flows:admin",
    "requests:read",
    "requests:write",
    "requests:read-all",
    "executions:reconcile",
    "executions:cancel",
    "plans:admin",
    "events:write",
    "notices:read",
    "org:admin",
    "approvals:decide",
]
_SWITCHES = ("WORKER_ENABLED", "REQUEST_API_ENABLED", "FLOW_ADMIN_ENABLED")


def run_dev(settings: Settings) -> int:
    """Run until SIGINT or SIGTERM; every setting given in the environment is honoured."""
    home = settings.home_path
    home.mkdir(parents=True, exist_ok=True)
    local = None
    data_dir = None
    if settings.database_url:
        migration_url = settings.migration_database_url or settings.database_url
        runtime_url = settings.database_url
        runtime_role = migrate.runtime_role_for(runtime_url, settings.runtime_database_role)
    else:
        from orquestador.db.local import start_local_database

        local = start_local_database(home)
        migration_url, runtime_url, runtime_role = (
            local.migration_url,
            local.runtime_url,
            local.runtime_role,
        )
        data_dir = local.server.data_dir
        if local.server.adopted_pid is not None:
            # An earlier dev killed without a stop (kill -9, a closed terminal) leaves its
            # server running: this one takes it over rather than fail or start a second.
            log.info(
                "adopted the embedded PostgreSQL server already running on %s (pid %s), "
                "left running by an earlier orquestador dev that did not stop; it stops "
                "with this one",
                data_dir,
                local.server.adopted_pid,
            )
    try:
        migrate.upgrade(migrate.alembic_config(url=migration_url, runtime_role=runtime_role))
        if runtime_role:
            migrate.grant_runtime_role(migration_url, runtime_role)
        settings = _dev_settings(settings, runtime_url, migration_url)
        return _serve(settings, data_dir)
    finally:
        if local is not None:
            local.server.stop()


def _dev_settings(settings: Settings, runtime_url: str, migration_url: str) -> Settings:
    # Everything on unless the environment says otherwise.
    switches = {
        name.lower(): getattr(settings, name.lower()) if name in os.environ else True
        for name in _SWITCHES
    }
    _ensure_dev_secret(settings)
    # Trying schedules out means watching them fire: every second unless the environment
    # names a minimum.
    pace = {} if "SCHEDULE_MIN_SECONDS" in os.environ else {"schedule_min_seconds": 1}
    return settings.with_overrides(
        database_url=runtime_url, migration_database_url=migration_url, **switches, **pace
    )


def _ensure_dev_secret(settings: Settings) -> None:
    """Keep a signing key under ORQUESTADOR_HOME so `orquestador token` here mints valid tokens."""
    if settings.jwt_secret or settings.dev_secret_path.exists():
        return
    path = settings.dev_secret_path
    path.touch(mode=0o600)
    path.write_text(secrets.token_urlsafe(32) + "\n")


def _serve(settings: Settings, data_dir: Path | None) -> int:
    from orquestador.api.app import create_app
    from orquestador.serve import serve_in_thread

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    # Bind first: a busy port ends here, before any work is claimed (the server
    # explains which port and exits 1).
    server, _ = serve_in_thread(create_app(settings), settings.api_host, settings.api_port)
    # The command line run in this folder finds the API here, whatever port it got.
    record_dev_api(settings.home_path, loopback_url(settings.api_host, server.server_port))
    try:
        return _run_until_stopped(settings, server, stop, data_dir)
    finally:
        forget_dev_api(settings.home_path)


def _run_until_stopped(
    settings: Settings, server: BaseWSGIServer, stop: threading.Event, data_dir: Path | None
) -> int:
    from orquestador.api.tokens import mint_token
    from orquestador.machines.bell import stop_polls
    from orquestador.serve import start_metrics_listener

    listener = start_metrics_listener(settings)
    worker = None
    if settings.worker_enabled:
        from orquestador.worker.daemon import build_worker

        worker = build_worker(settings)
        worker.start()
    token = mint_token(
        settings, sub=DEV_SUBJECT, org=DEV_ORG, scopes=DEV_SCOPES, ttl_seconds=7 * 24 * 3600
    )
    # One process: the API's /metrics already holds the worker's series too; with
    # METRICS_BIND it is served there (started first), not on the API's port.
    metrics = (
        f"http://{settings.metrics_bind}/metrics"
        if listener is not None
        else f"http://{settings.api_host}:{server.server_port}/metrics"
    )
    if worker is not None and worker.metrics_port:
        metrics += f", worker http://{settings.api_host}:{worker.metrics_port}/metrics"
    print(
        "orquestador dev is running\n"
        f"  API:          http://{settings.api_host}:{server.server_port}/api/v1\n"
        f"  pages:        http://{settings.api_host}:{server.server_port}/ui/login"
        " (sign in with the token below)\n"
        f"  DATABASE_URL: {settings.database_url}\n"
        + (f"  data:         {data_dir}\n" if data_dir else "")
        + f"  worker:       {'on' if worker else 'off'}\n"
        + f"  e-mail:       {_email_said(settings)}\n"
        + f"  metrics:      {metrics}\n"
        f"  token:        {token}\n"
        f"  token holder: sub {DEV_SUBJECT}, org {DEV_ORG}, scopes {' '.join(DEV_SCOPES)}\n"
        f"  more tokens:  ORQUESTADOR_HOME={settings.home_path.resolve()} orquestador token "
        f'--sub {DEV_SUBJECT} --org {DEV_ORG} --scope "requests:read"\n'
        "Join more workers with: WORKER_ENABLED=true DATABASE_URL=<the URL above> "
        "orquestador worker\nStop with Ctrl-C.",
        flush=True,
    )
    stop.wait()
    print("stopping: draining the worker and the API", flush=True)
    # Open agent polls answer 204 now, and the command bell goes quietly with the database.
    stop_polls()
    server.shutdown()
    if listener is not None:
        listener.shutdown()
        listener.server_close()
    if worker is not None:
        worker.request_stop()
        worker.join(settings.worker_drain_seconds + 10)
        worker.engine.dispose()
    return 0


def _email_said(settings: Settings) -> str:
    """Whether notices' e-mails leave, and how to make them (docs/NOTICES.md)."""
    if not settings.smtp_url:
        return (
            "off: e-mails wait in the outbox; set SMTP_URL (e.g. smtp://127.0.0.1:1025) "
            "to deliver them, see docs/NOTICES.md"
        )
    from orquestador.notices.smtp import SmtpTarget

    return f"on, through {SmtpTarget.parse(settings.smtp_url).describe()} as {settings.smtp_from}"
