"""The real API served on a loopback port, for the tests that run the command line against it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.config import Settings
from orquestador.serve import serve_in_thread
from tests.db_support import TestDatabase


@contextmanager
def served_api(
    database: TestDatabase, secret: str, *, registry: Any = None, **overrides: Any
) -> Iterator[tuple[str, Settings]]:
    """(the API's base URL, its settings), both route groups on, HS256 with `secret`;
    `overrides` sets other settings."""
    settings = Settings.from_env(
        {},
        database_url=database.runtime_dsn,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret=secret,
        **overrides,
    )
    app = create_app(settings, registry=registry)
    http, thread = serve_in_thread(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{http.server_port}/api/v1", settings
    finally:
        http.shutdown()
        thread.join(10)
        app.extensions[EXTENSION_KEY].engine.dispose()
