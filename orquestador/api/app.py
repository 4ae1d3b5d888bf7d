"""The Flask application factory; gunicorn serves `orquestador.api.app:create_app()`."""

from __future__ import annotations

import logging

from flask import Flask
from sqlalchemy import Engine

from orquestador.api import (
    execution_routes,
    flow_routes,
    health_routes,
    openapi,
    request_routes,
)
from orquestador.api.auth import TokenVerifier
from orquestador.api.capabilities import KnowsCapabilities, capability_checker
from orquestador.api.context import EXTENSION_KEY, ApiContext, LazyEngine
from orquestador.api.problems import register_error_handlers
from orquestador.config import Settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    registry: KnowsCapabilities | None = None,
) -> Flask:
    """Build the app; the database engine is created on first use in each process.

    `engine` and `registry` replace the configured ones (tests, embedding in `dev`).
    """
    settings = settings or Settings.from_env()
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = settings.api_max_body_bytes
    # Keep field order as written: ExecutionView and friends read better that way.
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION_KEY] = ApiContext(
        settings=settings,
        engine=LazyEngine(settings.database_url, engine),
        verifier=TokenVerifier(settings),
        capability_problem=capability_checker(settings, registry),
    )
    register_error_handlers(app)
    app.register_blueprint(health_routes.blueprint)
    app.register_blueprint(openapi.blueprint)
    # A switched-off group has no routes at all, so it answers the same 404 as any
    # unknown path.
    if settings.flow_admin_enabled:
        app.register_blueprint(flow_routes.blueprint)
    if settings.request_api_enabled:
        app.register_blueprint(request_routes.blueprint)
        app.register_blueprint(execution_routes.blueprint)
    log.info(
        "API created",
        extra={
            "flow_admin_enabled": settings.flow_admin_enabled,
            "request_api_enabled": settings.request_api_enabled,
        },
    )
    return app
