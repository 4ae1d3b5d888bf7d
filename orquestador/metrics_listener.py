"""/metrics on an address of its own (METRICS_BIND): off the API's public port.

The registry a scrape reads is every process's under gunicorn (the files each worker
writes to PROMETHEUS_MULTIPROC_DIR), else this process's own, as on the API's port.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app, multiprocess
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

StartResponse = Callable[..., Any]


def scrape_registry() -> CollectorRegistry:
    """Every worker process's values under gunicorn, else this process's registry."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def _metrics_only(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    if environ.get("PATH_INFO") != "/metrics":
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "0")])
        return [b""]
    return make_wsgi_app(scrape_registry())(environ, start_response)  # type: ignore[no-any-return]


def serve_metrics(host: str, port: int) -> WSGIServer:
    """Serve /metrics on HOST:PORT in a daemon thread; OSError when it cannot listen there.

    `shutdown()` and `server_close()` stop it.
    """
    server = make_server(host, port, _metrics_only, ThreadingWSGIServer, _SilentHandler)
    thread = threading.Thread(target=server.serve_forever, name="orquestador-metrics", daemon=True)
    thread.start()
    return server
