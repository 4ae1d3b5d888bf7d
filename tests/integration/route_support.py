"""Routes as an operator writes them, for the tests that run them against the provider double."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orquestador.actions import AdapterRegistry
from orquestador.integrations.http_adapter import http_adapter
from orquestador.integrations.routes import load_routes
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import settings

SECRET = "sk_live_0123456789abcdefSECRET"
OUTPUT = 'output_schema = { type = "object", required = ["id"] }'


def billing_route(
    effect: str = "IDEMPOTENT_WRITE", extra: str = "", path: str = "/v1/invoices"
) -> str:
    return f"""
[[route]]
capability = "billing.invoice"
version = 1
effect = "{effect}"
method = "POST"
url = "${{BILLING_URL}}{path}"
headers = {{ Authorization = "Bearer ${{BILLING_TOKEN}}" }}
timeout_seconds = 1
max_attempts = 3
input_schema = {{ type = "object", required = ["amount"] }}
{OUTPUT}
response = {{ id = "/id", status = "/status" }}
{extra}
"""


LOOKUP = (
    'lookup = { url = "${BILLING_URL}/v1/invoices?idempotency_key={externalKey}", '
    'found = "/data/0" }'
)


def route_registry(tmp_path: Path, provider_url: str, toml: str) -> AdapterRegistry:
    path = tmp_path / "integrations.toml"
    path.write_text(toml)
    environ = {"BILLING_URL": provider_url, "BILLING_TOKEN": SECRET}
    registry = AdapterRegistry()
    for route in load_routes(path, environ, lease_seconds=30):
        registry.add(http_adapter(route))
    return registry


def fast_executor(registry: AdapterRegistry, **overrides: Any) -> Executor:
    values = {"retry_base_seconds": 0.001, "retry_cap_seconds": 0.001, **overrides}
    return Executor(registry, settings(**values), WorkerHooks())
