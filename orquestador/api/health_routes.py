"""Liveness and readiness probes and the Prometheus scrape, always on and unauthenticated."""

from __future__ import annotations

import logging
import os

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from orquestador.api.context import engine
from orquestador.api.problems import problem_response
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
    them all; otherwise this process's own registry answers.
    """
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        generate_latest,
        multiprocess,
    )

    import orquestador.metrics  # noqa: F401  every series is declared even before first use

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
