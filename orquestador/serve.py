"""Serving the WSGI app: gunicorn for `orquestador api`, a threaded server for `dev`."""

from __future__ import annotations

import threading
from typing import Any

from gunicorn.app.base import BaseApplication
from werkzeug.serving import BaseWSGIServer, make_server

from orquestador.config import Settings


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        super().__init__()

    def load_config(self) -> None:
        self.cfg.set("bind", f"{self._settings.api_host}:{self._settings.api_port}")
        self.cfg.set("workers", self._settings.api_workers)
        self.cfg.set("worker_class", "gthread")
        self.cfg.set("threads", 4)
        self.cfg.set("graceful_timeout", 20)
        self.cfg.set("accesslog", "-")
        # Newer gunicorn opens a control socket under $HOME; a service needs none, and
        # a hardened unit (ProtectHome) would refuse it.
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)

    def load(self) -> Any:
        # Each gunicorn worker builds its own app (and so its own engine) after the fork.
        from orquestador.api.app import create_app

        return create_app(self._settings)


def serve_with_gunicorn(settings: Settings) -> int:
    _Gunicorn(settings).run()
    return 0


def serve_in_thread(app: Any, host: str, port: int) -> tuple[BaseWSGIServer, threading.Thread]:
    """A threaded WSGI server in a daemon thread; call server.shutdown() to stop it."""
    server = make_server(host, port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="api", daemon=True)
    thread.start()
    return server, thread
