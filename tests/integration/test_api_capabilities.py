"""GET /capabilities: the registry's declared contracts, the registry loaded once per app."""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import Api, problem, running_api
from sqlalchemy import Engine

from orquestador.actions import ActionContext, Adapter, Effect, NotFound
from orquestador.api.capability_routes import ADAPTERS_EXTENSION
from orquestador.worker.executor import Executor
from tests.integration.worker_support import (
    action,
    execution,
    flow_definition,
    registry_of,
    run_once,
    settings,
)

MODULE = "orq_test_capability_adapters"
# What the adapter reaches its provider with: none of it may leave through the API.
PROVIDER_URL = "https://billing.invalid/v1/invoices"
PROVIDER_TOKEN = "sk_live_capability_secret_0123456789"


def _create_invoice(ctx: ActionContext) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {PROVIDER_TOKEN}"}
    raise AssertionError(f"never called here: {PROVIDER_URL} {headers}")


INVOICE = Adapter(
    capability="acme.invoice",
    version=2,
    effect=Effect.NON_IDEMPOTENT_WRITE,
    input_schema={"type": "object", "required": ["amount"]},
    output_schema={"type": "object", "required": ["invoiceId"]},
    timeout_seconds=10,
    max_attempts=1,
    invoke=_create_invoice,
    lookup=lambda ctx: NotFound(),
)
INVOICE_V1 = Adapter(
    capability="acme.invoice",
    version=1,
    effect=Effect.IDEMPOTENT_WRITE,
    input_schema={"type": "object"},
    output_schema={"type": "object"},
    timeout_seconds=2.5,
    max_attempts=3,
    invoke=_create_invoice,
)
QUOTE = Adapter(
    capability="acme.quote",
    version=1,
    effect=Effect.READ_ONLY,
    input_schema={"type": "object"},
    output_schema={"type": "object", "required": ["price"]},
    timeout_seconds=5,
    max_attempts=2,
    invoke=_create_invoice,
    simulate=lambda ctx: {"price": 10},  # what a dry run answers instead of calling
)
STOCK = Adapter(
    capability="acme.stock",
    version=1,
    effect=Effect.READ_ONLY,
    input_schema={"type": "object"},
    output_schema={"type": "object"},
    timeout_seconds=5,
    max_attempts=2,
    invoke=_create_invoice,
    dry_run="call",  # a read that asks to be called in dry runs too
)


BUILTINS = {"approval", "machine.command", "machine.wait", "notify", "rollout"}


@pytest.fixture
def registrations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """An operator module named in ADAPTER_MODULES; counts how often it registers."""
    calls: list[int] = []
    module = types.ModuleType(MODULE)

    def register(registry: Any) -> None:
        calls.append(1)
        # Out of order on purpose: the answer sorts.
        for adapter in (STOCK, QUOTE, INVOICE, INVOICE_V1):
            registry.add(adapter)

    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    return calls


@pytest.fixture
def api(database, registrations: list[int]) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=None, adapter_modules=MODULE) as api:
        yield api


def test_lists_the_operator_modules_adapters_by_capability_then_version(api: Api) -> None:
    response = api.get("/capabilities")

    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    items = response.get_json()["items"]
    # The built-ins that keep state simulate in dry runs instead of touching the world.
    builtins = {(i["capability"], i["canSimulate"]) for i in items if i["capability"] in BUILTINS}
    assert builtins == {(capability, True) for capability in BUILTINS}
    assert {"items": [i for i in items if i["capability"] not in BUILTINS]} == {
        "items": [
            {
                "capability": "acme.invoice",
                "version": 1,
                "effect": "IDEMPOTENT_WRITE",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "object"},
                "canLookUp": False,
                "canSimulate": False,
                "timeoutSeconds": 2.5,
                "maxAttempts": 3,
            },
            {
                "capability": "acme.invoice",
                "version": 2,
                "effect": "NON_IDEMPOTENT_WRITE",
                "inputSchema": {"type": "object", "required": ["amount"]},
                "outputSchema": {"type": "object", "required": ["invoiceId"]},
                "canLookUp": True,
                "canSimulate": False,
                "timeoutSeconds": 10,
                "maxAttempts": 1,
            },
            {
                "capability": "acme.quote",
                "version": 1,
                "effect": "READ_ONLY",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "object", "required": ["price"]},
                "canLookUp": False,
                "canSimulate": True,
                "timeoutSeconds": 5,
                "maxAttempts": 2,
            },
            {
                "capability": "acme.stock",
                "version": 1,
                "effect": "READ_ONLY",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "object"},
                "canLookUp": False,
                "canSimulate": True,
                "timeoutSeconds": 5,
                "maxAttempts": 2,
            },
            {
                "capability": "noop",
                "version": 1,
                "effect": "READ_ONLY",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "object"},
                "canLookUp": False,
                "canSimulate": True,
                "timeoutSeconds": 1,
                "maxAttempts": 1,
            },
        ]
    }


def test_only_the_declared_contract_leaves(api: Api) -> None:
    text = api.get("/capabilities").get_data(as_text=True)

    for secret in (PROVIDER_URL, "billing.invalid", PROVIDER_TOKEN, "Bearer", "_create_invoice"):
        assert secret not in text
    assert "example" not in text


def test_the_registry_is_loaded_once_and_shared_with_the_publishing_check(
    api: Api, registrations: list[int]
) -> None:
    assert api.get("/capabilities").status_code == 200
    assert api.get("/capabilities").status_code == 200
    # Its input fits the contract: publishing checks it against the same registry.
    api.publish(
        flow_definition([action("bill", "acme.invoice", version=2, input={"amount": {"const": 5}})])
    )

    assert registrations == [1]
    registry = api.app.extensions[ADAPTERS_EXTENSION]
    assert registry.knows("acme.invoice", 2)


def test_a_missing_token_is_401(api: Api) -> None:
    response = api.client().get("/api/v1/capabilities")

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert problem(response)["status"] == 401


def test_a_token_without_flows_admin_is_403(api: Api) -> None:
    response = api.get("/capabilities", scopes=["requests:read", "requests:write"])

    assert response.status_code == 403
    assert problem(response)["status"] == 403


def test_switched_off_flow_administration_has_no_catalogue(database) -> None:
    with running_api(database.runtime_dsn, registry=None, flow_admin_enabled=False) as api:
        response = api.get("/capabilities")

    assert response.status_code == 404


def test_an_unconfigured_capability_is_refused_at_publish_with_its_path(api: Api) -> None:
    response = api.post("/flows", flow_definition([action("bill", "acme.invoice", version=3)]))

    assert response.status_code == 422
    assert {
        "path": "/transitions/0/actions/0/capability",
        "message": "unknown capability acme.invoice version 3",
    } in problem(response)["problems"]


def test_a_capability_gone_after_publishing_fails_integration_unavailable(
    api: Api, runtime_engine: Engine
) -> None:
    flow = api.publish(
        flow_definition([action("bill", "acme.invoice", version=2, input={"amount": {"const": 5}})])
    )
    created = api.create_request(flow["id"], {})
    accepted = api.transition(created["id"], "go", created["revision"])
    assert accepted.status_code == 202

    # The worker restarted without the operator module: only the built-ins remain.
    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "FAILED"
    row = execution(runtime_engine, uuid.UUID(accepted.get_json()["executionId"]))
    assert row.error_code == "INTEGRATION_UNAVAILABLE"
