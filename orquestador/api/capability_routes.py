"""The capability catalogue: the app's adapter registry, and its declared contracts over HTTP."""

from __future__ import annotations

import threading
from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from orquestador.actions import Adapter, AdapterRegistry, load_registry
from orquestador.api.auth import requires_scope
from orquestador.api.claims import SCOPE_FLOWS_ADMIN
from orquestador.api.context import api_context
from orquestador.api.views import API_PREFIX

blueprint = Blueprint("capabilities", __name__, url_prefix=f"{API_PREFIX}/capabilities")

# Where the app's adapter registry lives in app.extensions. `create_app` puts the one it
# was given or loaded there; an app built around a stand-in that only answers `knows`
# (tests) may put a registry of its own there, or leave the configured one (built-ins,
# ADAPTER_MODULES and the operator's routes, as the worker loads them) to load on first use.
ADAPTERS_EXTENSION = "orquestador.adapters"

# Loading imports operator modules and reads their configuration: once per app, even
# when the first requests arrive together.
_loading = threading.Lock()


def app_adapters() -> AdapterRegistry:
    """The adapter registry this app checks and lists capabilities with, loaded at most once."""
    extensions = current_app.extensions
    found = extensions.get(ADAPTERS_EXTENSION)
    if found is None:
        with _loading:
            found = extensions.get(ADAPTERS_EXTENSION)
            if found is None:
                found = extensions[ADAPTERS_EXTENSION] = load_registry(api_context().settings)
    return found


def capability_view(adapter: Adapter) -> dict[str, Any]:
    """What a flow author may know of an adapter: its declared contract, nothing it runs with.

    The invoke and lookup functions, and whatever they close over (URLs, headers,
    secrets), stay out. A dry run calls `simulate` instead (built-ins, and routes that
    declare an `example`); an adapter without it cannot simulate unless it runs only in
    simulation.
    """
    return {
        "capability": adapter.capability,
        "version": adapter.version,
        "effect": str(adapter.effect),
        "inputSchema": adapter.input_schema,
        "outputSchema": adapter.output_schema,
        "canLookUp": adapter.lookup is not None,
        # A dry run can use it: it simulates, runs only in dry runs, or is a read that
        # asked to be called in dry runs (dry_run = "call").
        "canSimulate": (
            adapter.simulation_only or adapter.simulate is not None or adapter.dry_run == "call"
        ),
        "timeoutSeconds": adapter.timeout_seconds,
        "maxAttempts": adapter.max_attempts,
    }


@blueprint.get("")
@requires_scope(SCOPE_FLOWS_ADMIN)
def listing() -> Response:
    adapters = sorted(app_adapters().adapters(), key=lambda a: (a.capability, a.version))
    return jsonify({"items": [capability_view(a) for a in adapters]})
