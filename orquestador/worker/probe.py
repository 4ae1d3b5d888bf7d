"""The worker's HTTP endpoint on WORKER_METRICS_PORT: metrics, liveness and readiness.

`/metrics` is Prometheus text; `/healthz` answers 200 while the process serves;
`/readyz` answers 200 when every long-lived thread is running and its last round
succeeded, 503 (a problem document naming the threads) while one is failing, such as
during a database restart. Nothing here touches the database itself: the threads'
own last attempts are the evidence, so a probe never adds load to a struggling server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from orquestador.problems import PROBLEM_MEDIA_TYPE, problem_document

# The worker's state for /readyz: thread name -> healthy now.
ReadinessCheck = Callable[[], dict[str, bool]]
StartResponse = Callable[..., Any]


def probe_app(readiness: ReadinessCheck) -> Callable[[dict[str, Any], StartResponse], Any]:
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _json(start_response, 200, {"status": "ok"})
        if path == "/readyz":
            threads = readiness()
            failing = sorted(name for name, healthy in threads.items() if not healthy)
            if failing:
                body = problem_document(
                    503, "WORKER_NOT_READY", f"Failing now: {', '.join(failing)}."
                )
                body["threads"] = threads
                return _json(start_response, 503, body, media_type=PROBLEM_MEDIA_TYPE)
            return _json(start_response, 200, {"status": "ok", "threads": threads})
        return metrics(environ, start_response)

    return app


def _json(
    start_response: StartResponse,
    status: int,
    body: dict[str, Any],
    media_type: str = "application/json",
) -> list[bytes]:
    data = json.dumps(body).encode()
    reason = {200: "OK", 503: "Service Unavailable"}[status]
    start_response(
        f"{status} {reason}",
        [
            ("Content-Type", media_type),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
        ],
    )
    return [data]


def start_probe_server(host: str, port: int, readiness: ReadinessCheck) -> WSGIServer:
    """Serve in a daemon thread; `shutdown()` and `server_close()` stop it."""
    server = make_server(
        host, port, probe_app(readiness), ThreadingWSGIServer, handler_class=_SilentHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="orquestador-metrics", daemon=True)
    thread.start()
    return server
