"""The Flask application factory; gunicorn serves `orquestador.api.app:create_app()`."""

from __future__ import annotations

import contextlib
import logging
import time

from flask import Flask, Response, g, redirect, request, url_for
from sqlalchemy import Engine

from orquestador import tracing
from orquestador.actions import AdapterRegistry, load_registry
from orquestador.api import (
    agent_routes,
    approval_routes,
    auth_routes,
    bulk_routes,
    capability_routes,
    dry_run_routes,
    event_routes,
    execution_routes,
    flow_routes,
    health_routes,
    machine_routes,
    notice_routes,
    plan_routes,
    quota_routes,
    request_routes,
    rollout_routes,
    run_routes,
    schedule_routes,
)
from orquestador.api.auth import TokenVerifier
from orquestador.api.capabilities import KnowsCapabilities, capability_checker
from orquestador.api.capability_routes import ADAPTERS_EXTENSION
from orquestador.api.context import EXTENSION_KEY, ApiContext, LazyEngine
from orquestador.api.limits import (
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADER_FIELDS,
    MAX_REQUEST_LINE_BYTES,
)
from orquestador.api.openapi import document as openapi
from orquestador.api.pages import (
    actions,  # noqa: F401  (its routes join the pages' blueprint)
    bulk,  # noqa: F401  (so do these)
    # Imported for its side effect: it adds the console's read pages to the pages'
    # blueprint, which must happen before create_app registers that blueprint.
    console,  # noqa: F401
)
from orquestador.api.pages import routes as pages
from orquestador.api.problems import ApiProblem, register_error_handlers
from orquestador.api.proxies import from_trusted_proxy
from orquestador.config import Settings
from orquestador.logs import bind_context, reset_context

log = logging.getLogger(__name__)

# The request head gunicorn accepts (serve.py hands it the same limits). The app checks
# them itself, so the development server, whose own limits are looser, answers alike.


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
    tracing.configure(settings, "orquestador-api")
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = settings.api_max_body_bytes
    # Keep field order as written: ExecutionView and friends read better that way.
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # Loaded once: the publishing check, the capability listing and the check of an
    # operator's confirmed output all answer from the same registry.
    adapters = registry if registry is not None else load_registry(settings)
    app.extensions[EXTENSION_KEY] = ApiContext(
        settings=settings,
        engine=LazyEngine(settings.database_url, engine, settings),
        verifier=TokenVerifier(settings),
        capability_problem=capability_checker(settings, adapters),
    )
    if isinstance(adapters, AdapterRegistry):
        # A stand-in that only answers `knows` (tests) has no contracts to list or check
        # outputs with: those load the configured registry on first use instead.
        app.extensions[ADAPTERS_EXTENSION] = adapters
    register_error_handlers(app)
    # Timing starts first and is recorded last, so refusals and problems count too.
    app.before_request(_start_timer)
    app.before_request(_refuse_oversized_head)
    app.after_request(_add_hygiene_headers)
    app.after_request(_record_request_metrics)
    app.teardown_request(_end_log_context)
    app.teardown_request(_end_request_span)
    app.register_blueprint(health_routes.blueprint)
    app.register_blueprint(openapi.blueprint)
    # A switched-off group has no routes at all, so it answers the same 404 as any
    # unknown path.
    if settings.flow_admin_enabled:
        app.register_blueprint(flow_routes.blueprint)
        app.register_blueprint(capability_routes.blueprint)
        app.register_blueprint(plan_routes.blueprint)
        app.register_blueprint(schedule_routes.blueprint)
        app.register_blueprint(dry_run_routes.blueprint)
    if settings.request_api_enabled:
        app.register_blueprint(request_routes.blueprint)
        app.register_blueprint(run_routes.blueprint)
        app.register_blueprint(execution_routes.blueprint)
        app.register_blueprint(rollout_routes.blueprint)
        app.register_blueprint(bulk_routes.blueprint)
        app.register_blueprint(event_routes.blueprint)
        app.register_blueprint(notice_routes.blueprint)
        app.register_blueprint(quota_routes.blueprint)
        app.register_blueprint(approval_routes.blueprint)
        app.register_blueprint(auth_routes.blueprint)
        app.register_blueprint(agent_routes.blueprint)
        app.register_blueprint(machine_routes.blueprint)
        app.register_blueprint(pages.blueprint)
        # A person who opens the bare address lands on the pages, not on a 404.
        app.add_url_rule("/", "home", _to_executions_page, methods=["GET"])
    log.info(
        "API created",
        extra={
            "flow_admin_enabled": settings.flow_admin_enabled,
            "request_api_enabled": settings.request_api_enabled,
        },
    )
    return app


def _to_executions_page() -> Response:
    return redirect(url_for("ui.executions"), code=302)


def _refuse_oversized_head() -> None:
    # WSGI servers hand the head over decoded as latin-1: one character per byte.
    environ = request.environ
    target = environ.get("RAW_URI") or environ.get("REQUEST_URI") or request.full_path
    line = f"{request.method} {target} {environ.get('SERVER_PROTOCOL', 'HTTP/1.1')}"
    if len(line) > MAX_REQUEST_LINE_BYTES:
        raise ApiProblem(
            414,
            "URI_TOO_LONG",
            f"The request line is longer than {MAX_REQUEST_LINE_BYTES} bytes.",
        )
    if len(request.headers) > MAX_HEADER_FIELDS:
        raise ApiProblem(
            431,
            "HEADERS_TOO_LARGE",
            f"The request has more than {MAX_HEADER_FIELDS} header fields.",
        )
    # Repeated fields arrive joined into one and count together.
    if any(len(name) + len(value) + 4 > MAX_HEADER_FIELD_BYTES for name, value in request.headers):
        raise ApiProblem(
            431,
            "HEADERS_TOO_LARGE",
            f"A header field is longer than {MAX_HEADER_FIELD_BYTES} bytes.",
        )


# The route label of a request that matched no URL rule (404s, refused heads).
UNMATCHED_ROUTE = "unmatched"


def _start_timer() -> None:
    g.orquestador_started = time.perf_counter()
    # Every line logged while serving names the route and the ids in its path (never the
    # query string or the body): `execution_id`, `request_id`, `flow_id`, ...
    rule = request.url_rule
    fields: dict[str, str] = {
        "route": rule.rule if rule is not None else UNMATCHED_ROUTE,
        "method": request.method,
    }
    for name, value in (request.view_args or {}).items():
        if name.endswith("_id"):
            fields[name] = str(value)
    g.orquestador_log_context = bind_context(**fields)
    if tracing.enabled():
        # Named by the route template, like the metrics: never an id or a query string.
        spans = g.orquestador_span = contextlib.ExitStack()
        g.orquestador_span_handle = spans.enter_context(
            tracing.request_span(
                f"{request.method} {fields['route']}",
                request.headers,
                {"http.request.method": request.method, "http.route": fields["route"]},
                trusted_caller=from_trusted_proxy(),
            )
        )


def _end_request_span(error: BaseException | None) -> None:
    spans = g.pop("orquestador_span", None)
    if spans is not None:
        spans.close()


def _end_log_context(error: BaseException | None) -> None:
    token = g.pop("orquestador_log_context", None)
    if token is not None:
        # A response streamed from another context cannot reset this one; it ends with
        # the request's own context anyway.
        with contextlib.suppress(ValueError):
            reset_context(token)


def _record_request_metrics(response: Response) -> Response:
    # Imported here, not at the top: under gunicorn the multiprocess directory is set
    # before the first metric is made (serve.py), and this runs only in a worker.
    from orquestador.metrics import HTTP_REQUEST_DURATION_SECONDS, HTTP_REQUESTS_TOTAL

    # The URL rule's template, never the raw path: ids would make a series per request.
    rule = request.url_rule
    route = rule.rule if rule is not None else UNMATCHED_ROUTE
    HTTP_REQUESTS_TOTAL.labels(route=route, status=str(response.status_code)).inc()
    span = g.get("orquestador_span_handle")
    if span is not None:
        span.set_attribute("http.response.status_code", response.status_code)
    started = g.get("orquestador_started")
    if started is not None:
        HTTP_REQUEST_DURATION_SECONDS.labels(route=route).observe(time.perf_counter() - started)
    return response


def _add_hygiene_headers(response: Response) -> Response:
    # Answers depend on the bearer token: no cache, shared or private, may keep one.
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
