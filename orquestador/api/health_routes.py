"""Liveness and readiness probes and the Prometheus scrape, always on and unauthenticated."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from orquestador.api.context import api_context, engine
from orquestador.api.problems import not_found, problem_response
from orquestador.api.views import API_PREFIX

log = logging.getLogger(__name__)

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
@blueprint.get(f"{API_PREFIX}/healthz")
def healthz() -> Response:
    """The process answers; deliberately no database call, so a slow database never restarts it."""
    return jsonify({"status": "ok"})


@blueprint.get("/readyz")
@blueprint.get(f"{API_PREFIX}/readyz")
def readyz() -> Response:
    try:
        with engine().connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        log.warning("readiness check failed: %s", type(exc).__name__)
        return problem_response(
            503,
            "DATABASE_UNAVAILABLE",
            "The database does not answer.",
            headers={"Retry-After": "5"},
        )
    return jsonify({"status": "ok"})


@blueprint.get("/metrics")
def metrics() -> Response:
    """Prometheus text format; under gunicorn, the sum over every worker process.

    With PROMETHEUS_MULTIPROC_DIR set (serve.py sets it for gunicorn) each worker
    writes its values to files there, and a scrape, whichever worker answers it, reads
    them all; otherwise this process's own registry answers. With METRICS_BIND set it
    is served there instead (metrics_listener.py), and this port does not answer it.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    import orquestador.metrics  # noqa: F401  every series is declared even before first use
    from orquestador.metrics_listener import scrape_registry

    if api_context().settings.metrics_bind:
        raise not_found()
    return Response(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
