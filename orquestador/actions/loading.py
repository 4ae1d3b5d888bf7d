"""Building the adapter registry a process runs with: built-ins, then operator modules."""

from __future__ import annotations

import importlib
import logging
import os

from orquestador.actions.builtin import register_builtins
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings
from orquestador.errors import ConfigError

log = logging.getLogger(__name__)


def load_registry(settings: Settings) -> AdapterRegistry:
    """Register the built-in adapters, the routes of INTEGRATIONS_FILE, then each operator module.

    Each module's `register(registry)` is called in the order ADAPTER_MODULES lists them.
    """
    registry = AdapterRegistry()
    register_builtins(registry, settings)
    if settings.integrations_file:
        # Imported here: only a process configured with routes needs an HTTP client.
        from orquestador.integrations.http_adapter import http_adapter
        from orquestador.integrations.routes import load_routes

        routes = load_routes(settings.integrations_file, os.environ, settings.worker_lease_seconds)
        for route in routes:
            registry.add(http_adapter(route))
        log.info("integration routes loaded", extra={"routes": len(routes)})
    for name in settings.adapter_module_names:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise ConfigError([f"ADAPTER_MODULES: cannot import {name!r}: {exc}"]) from exc
        register = getattr(module, "register", None)
        if not callable(register):
            raise ConfigError([f"ADAPTER_MODULES: module {name!r} has no register(registry)"])
        try:
            register(registry)
        except Exception as exc:
            raise ConfigError([f"ADAPTER_MODULES: {name}.register failed: {exc}"]) from exc
        log.info("adapter module loaded", extra={"adapter_module": name})
    return registry
