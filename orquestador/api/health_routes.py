"""Liveness and readiness probes, always on and unauthenticated."""

from __future__ import annotations

import logging

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
