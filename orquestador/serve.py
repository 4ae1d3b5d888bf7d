"""Serving the WSGI app: gunicorn for `orquestador api`, a threaded server for `dev`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus
from wsgiref.simple_server import WSGIServer

from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.http.errors import LimitRequestHeaders, LimitRequestLine
from gunicorn.workers.gthread import ThreadWorker
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from orquestador.api.limits import (
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADER_FIELDS,
    MAX_REQUEST_LINE_BYTES,
)
from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.logs import make_formatter
from orquestador.problems import PROBLEM_MEDIA_TYPE, code_for_status, problem_document

REDACTED = "[redacted]"
# Query parameters whose value may be a credential (`?access_token=`, `?jwt=`,
# `?api_key=`): authentication is by the Authorization header only, but a client may
# still send one, and an access log is read by more people than the token was meant for.
_SECRET_PARAMETER_NAME = re.compile(
    r"token|jwt|secret|passw|auth|api[-_.]?key|signature|credential", re.IGNORECASE
)
_QUERY_PARAMETER = re.compile(
    r"(?P<lead>[?&;])(?P<name>[^=&;#?\s\"']+)=(?P<value>[^&;#\s\"'\x1b]*)"
)

# What the servers say when they refuse a request head before the app sees it.
_HEAD_REFUSALS = {
    HTTPStatus.REQUEST_URI_TOO_LONG: (
        f"The request line is longer than {MAX_REQUEST_LINE_BYTES} bytes."
    ),
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: (
        f"The request has more than {MAX_HEADER_FIELDS} header fields or a field longer "
        f"than {MAX_HEADER_FIELD_BYTES} bytes."
    ),
}


def redact_query_secrets(text: str) -> str:
    """TEXT (a request line, a URL, a log line) with credential-like query values replaced."""

    def replace(match: re.Match[str]) -> str:
        if not _SECRET_PARAMETER_NAME.search(unquote_plus(match["name"])):
            return match[0]
        return f"{match['lead']}{match['name']}={REDACTED}"

    return _QUERY_PARAMETER.sub(replace, text)


def _problem_head_and_body(status: int) -> tuple[list[tuple[str, str]], bytes]:
    body = json.dumps(
        problem_document(status, code_for_status(status), _HEAD_REFUSALS.get(status))
    ).encode()
    headers = [
        ("Content-Type", PROBLEM_MEDIA_TYPE),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        # The rest of what the client sent cannot be told apart from a next request.
        ("Connection", "close"),
    ]
    return headers, body


class _RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_query_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class RedactingGunicornLogger(GunicornLogger):  # type: ignore[misc]
    """gunicorn's logger in LOG_FORMAT; credential-like query values never reach its lines.

    Access lines in `json` carry method, path, query (redacted), status, bytes and
    duration as fields; in `text` they follow ACCESS_LOG_FORMAT. `log_format` is set by
    `orquestador api`; a plain `gunicorn -c gunicorn.conf.py` reads LOG_FORMAT.
    """

    log_format: str | None = None

    def _format(self) -> str:
        return self.log_format or os.environ.get("LOG_FORMAT", "text").strip().lower() or "text"

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        formatter = make_formatter(self._format(), level=cfg.loglevel)
        for logger in (self.access_log, self.error_log):
            for handler in logger.handlers:
                handler.setFormatter(formatter)
            if not any(isinstance(f, _RedactingFilter) for f in logger.filters):
                logger.addFilter(_RedactingFilter())

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if self._format() != "json":
            super().access(resp, req, environ, request_time)
            return
        if not self.access_log_enabled:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        query = atoms.get("q") or ""
        fields = {
            "remote_addr": atoms["h"],
            "method": atoms["m"],
            "path": atoms["U"],
            # The query string, its credential-like values replaced; never the raw one.
            "query": redact_query_secrets(f"?{query}")[1:] if query else "",
            "status": int(atoms["s"]) if str(atoms["s"]).isdigit() else atoms["s"],
            "response_bytes": atoms["B"],
            "duration_seconds": round(atoms["D"] / 1_000_000, 6),
            "user_agent": atoms["a"],
        }
        try:
            self.access_log.info("%s %s %s", atoms["m"], atoms["U"], atoms["s"], extra=fields)
        except Exception:
            self.error("Failed to log the access line")


class ProblemThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker; its refusal of an oversized request head is a problem.

    gunicorn answers its own 414 and 431 before any application runs, as an HTML page;
    an API client gets the same problem+json as from the app instead. Every other error
    gunicorn handles as it always does. The app learns how many request threads it has
    (agent long polls and execution waits may hold only a share of them), and a stopping
    worker ends its open long polls with 204, and its waits with the view as it is, rather
    than wait out each one's time.
    """

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # Imported in the worker: the routes' modules make metrics, which must not
        # exist before the master has prepared the multiprocess directory.
        from orquestador.api.agent_routes import size_poll_share
        from orquestador.api.execution_routes import size_wait_share

        # The threads actually run, even when a command line overrode API_THREADS.
        size_poll_share(self.wsgi, self.cfg.threads)
        size_wait_share(self.wsgi, self.cfg.threads)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        from orquestador.api.execution_waits import stop_waits
        from orquestador.machines.bell import stop_polls

        # On the worker's own loop, not in the signal handler: it takes the bells' locks.
        self.method_queue.defer(stop_polls)
        stop_waits()

    def handle_error(self, req: Any, client: socket.socket, addr: Any, exc: BaseException) -> None:
        if isinstance(exc, LimitRequestLine):
            status = HTTPStatus.REQUEST_URI_TOO_LONG
        elif isinstance(exc, LimitRequestHeaders):
            status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
        else:
            super().handle_error(req, client, addr, exc)
            return
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        headers, body = _problem_head_and_body(status)
        head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers
        )
        try:
            gunicorn_util.write_nonblock(client, head.encode("latin-1") + b"\r\n" + body)
        except Exception:
            self.log.debug("Failed to send error message.")


# gunicorn waits this long for in-flight requests after SIGTERM before killing a worker;
# above the worker's default drain (20 s), so one stop timeout (the units' and the
# compose file's) fits every process of the image.
GRACEFUL_TIMEOUT_SECONDS = 30
# Request line (redacted), status, bytes, duration: what an operator greps for.
ACCESS_LOG_FORMAT = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms "%(a)s"'
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# Set when the directory was made here (no PROMETHEUS_MULTIPROC_DIR given): removed on exit.
_CREATED_METRICS_DIR = "_ORQUESTADOR_CREATED_METRICS_DIR"


def prepare_metrics_dir() -> Path:
    """Create or empty PROMETHEUS_MULTIPROC_DIR (a temporary one when unset); return it.

    Values left by an earlier run would be added to this run's; the directory is
    emptied before any worker starts. Set before the app (and its metrics) is loaded.
    """
    configured = os.environ.get(METRICS_DIR_VARIABLE, "").strip()
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for leftover in path.glob("*.db"):
            leftover.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="orquestador-metrics-"))
        os.environ[METRICS_DIR_VARIABLE] = str(path)
        os.environ[_CREATED_METRICS_DIR] = str(path)
    # A metric made before this point keeps its in-memory value (nothing in the normal
    # start-up makes one); those made later, in the workers, write to the directory.
    from prometheus_client import values

    values.ValueClass = values.get_value_class()
    return path


def on_starting(server: Any) -> None:
    """gunicorn hook (master, before any worker): a clean metrics directory."""
    prepare_metrics_dir()


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook (master): a dead worker's live gauges stop counting."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    """gunicorn hook (master, last): stop the metrics listener, remove a metrics directory
    this process made."""
    global _metrics_listener
    listener, _metrics_listener = _metrics_listener, None
    if listener is not None:
        listener.shutdown()
        listener.server_close()
    created = os.environ.pop(_CREATED_METRICS_DIR, "")
    if created:
        shutil.rmtree(created, ignore_errors=True)


# The master's /metrics listener on METRICS_BIND, while it serves.
_metrics_listener: WSGIServer | None = None


class MetricsAddressTaken(ConfigError):
    """METRICS_BIND names an address another process listens on."""


def start_metrics_listener(settings: Settings) -> WSGIServer | None:
    """Serve /metrics on METRICS_BIND in a daemon thread (None when it is empty).

    One listener per host, whatever the number of gunicorn workers: it reads the values
    every process wrote (PROMETHEUS_MULTIPROC_DIR), else this process's own. Raises
    MetricsAddressTaken, one line, when the address is in use or cannot be bound.
    """
    address = settings.metrics_address
    if address is None:
        return None
    from orquestador.metrics_listener import serve_metrics

    try:
        return serve_metrics(*address)
    except OSError as error:
        raise MetricsAddressTaken(
            [
                f"METRICS_BIND={settings.metrics_bind}: cannot listen there"
                f" ({error.strerror or error}); another process holds it, or the host is"
                " not this machine's: choose a free address"
            ]
        ) from None


def when_ready(server: Any) -> None:
    """gunicorn hook (master, before any worker): /metrics on METRICS_BIND, if set.

    A taken address stops the API with one line (exit status 2): a scrape that finds
    nobody, or another program, would hide that the API is up.
    """
    global _metrics_listener
    settings = Settings.from_env() if _settings_of_run is None else _settings_of_run
    try:
        _metrics_listener = start_metrics_listener(settings)
    except MetricsAddressTaken as taken:
        server.log.error("%s", taken.problems[0])
        server.halt(exit_status=2)
    if _metrics_listener is not None:
        server.log.info("metrics on http://%s/metrics", settings.metrics_bind)


def post_fork(server: Any, worker: Any) -> None:
    """gunicorn hook (each worker): let go of the master's metrics socket, which the fork
    copied (its thread did not come along)."""
    if _metrics_listener is not None:
        _metrics_listener.socket.close()


# The settings `orquestador api` runs with (the hooks read the environment otherwise).
_settings_of_run: Settings | None = None


def gunicorn_options(settings: Settings) -> dict[str, Any]:
    """Every gunicorn setting of the API: `orquestador api` and gunicorn.conf.py share them."""
    return {
        "wsgi_app": "orquestador.api.app:create_app()",
        "bind": f"{settings.api_host}:{settings.api_port}",
        "workers": settings.api_workers,
        "worker_class": "orquestador.serve.ProblemThreadWorker",
        "threads": settings.api_threads,
        "graceful_timeout": max(GRACEFUL_TIMEOUT_SECONDS, settings.worker_drain_seconds + 10),
        "accesslog": "-",
        "access_log_format": ACCESS_LOG_FORMAT,
        "loglevel": settings.log_level.lower(),
        "logger_class": "orquestador.serve.RedactingGunicornLogger",
        # Set here rather than inherited, and checked by the app as well (docs/API.md,
        # "Limits"): about 800 KB of head at most, and a bearer token whose claims are
        # within the verifier's bounds fits one field several times over.
        "limit_request_line": MAX_REQUEST_LINE_BYTES,
        "limit_request_fields": MAX_HEADER_FIELDS,
        "limit_request_field_size": MAX_HEADER_FIELD_BYTES,
        # Newer gunicorn opens a control socket under $HOME; a service needs none, and
        # a hardened unit (ProtectHome) would refuse it.
        "control_socket_disable": True,
        # X-Forwarded-Proto (and gunicorn's other forwarded headers) count only from
        # TRUSTED_PROXIES, as the app's own checks: gunicorn's default trusts loopback.
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "on_starting": on_starting,
        "when_ready": when_ready,
        "post_fork": post_fork,
        "child_exit": child_exit,
        "on_exit": on_exit,
    }


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        super().__init__()

    def load_config(self) -> None:
        options = gunicorn_options(self._settings)
        # The format comes from these settings, not from the environment.
        options["logger_class"] = type(
            "SettingsGunicornLogger",
            (RedactingGunicornLogger,),
            {"log_format": self._settings.log_format},
        )
        for name, value in options.items():
            if name in self.cfg.settings:  # an older gunicorn lacks some
                self.cfg.set(name, value)

    def load(self) -> Any:
        # Each gunicorn worker builds its own app (and so its own engine) after the fork.
        from orquestador.api.app import create_app

        return create_app(self._settings)


def serve_with_gunicorn(settings: Settings) -> int:
    global _settings_of_run
    _settings_of_run = settings
    _Gunicorn(settings).run()
    return 0


# After a 413 the client may still be sending: what it sends is discarded for at most
# this long (and this much), so it can read the answer before the close resets it.
REFUSED_BODY_LINGER_SECONDS = 1.0
REFUSED_BODY_LINGER_BYTES = 1 << 20


class _RefusedBody:
    """Stands in for the handler's input once a body was refused as too large.

    werkzeug reads whatever follows its answer, up to 10 GB, before it closes. Instead
    the connection is closed for writing on the first read (the client sees the end of
    the answer at once) and the rest is discarded within a small budget, then cut.
    """

    def __init__(self, rfile: Any, connection: socket.socket) -> None:
        self._rfile = rfile
        self._connection = connection
        self._deadline = time.monotonic() + REFUSED_BODY_LINGER_SECONDS
        self._budget = REFUSED_BODY_LINGER_BYTES
        self._closed_for_writing = False

    def read(self, size: int = -1) -> bytes:
        if not self._closed_for_writing:
            self._closed_for_writing = True
            with contextlib.suppress(OSError):
                self._connection.shutdown(socket.SHUT_WR)
        if self._budget <= 0 or time.monotonic() >= self._deadline:
            return b""
        wanted = min(self._budget, 65536 if size < 0 else size, 65536)
        data: bytes = self._rfile.read1(wanted)
        self._budget -= len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rfile, name)


class DevRequestHandler(WSGIRequestHandler):
    """werkzeug's handler, minus its version banner, with problem refusals and safe log lines."""

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        if code == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
            # The unread rest of the body is no request of its own: close after the answer.
            self.close_connection = True
            self.rfile = _RefusedBody(self.rfile, self.connection)

    def version_string(self) -> str:
        # The default names werkzeug's and Python's versions in every `Server:` header.
        return "orquestador"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own refusals (a head over its limits, a malformed request line)
        # are HTML pages by default; the message may quote the request line, so it goes
        # to the (redacted) log only.
        self.log_error("code %d, message %s", code, message or self.responses.get(code, ("",))[0])
        headers, body = _problem_head_and_body(code)
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log(self, type: str, message: str, *args: Any) -> None:
        text = message % args if args else message
        super().log(type, "%s", redact_query_secrets(text))


class UnloggedRequestHandler(DevRequestHandler):
    """The same, without a line per request (errors are still logged)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


def serve_in_thread(
    app: Any, host: str, port: int, *, access_log: bool = True
) -> tuple[BaseWSGIServer, threading.Thread]:
    """A threaded WSGI server in a daemon thread; call server.shutdown() to stop it.

    `access_log=False`: no line per request, for a server only its own process calls."""
    handler = DevRequestHandler if access_log else UnloggedRequestHandler
    server = make_server(host, port, app, threaded=True, request_handler=handler)
    thread = threading.Thread(target=server.serve_forever, name="api", daemon=True)
    thread.start()
    return server, thread
