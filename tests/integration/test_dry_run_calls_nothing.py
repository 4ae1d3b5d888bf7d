"""A dry run calls nothing outside unless the route or adapter opts in (dry_run = "call").

Through the API and a real worker, against the provider double on 127.0.0.1: READ_ONLY
routes sent as GET and as POST (document.verify's fixed contract is a POST) and an
operator's READ_ONLY adapter that reads the same provider. Without the opt-in the
provider receives nothing: the step answers the route's example or fails
SIMULATION_UNSUPPORTED. With it, the read is sent as in a real run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from api_support import Api, running_api
from route_provider import RouteProvider
from sqlalchemy import Engine, text
from worker_support import action, dry_run_with_worker, flow_definition, settings

from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    Identity,
    PermanentError,
)
from orquestador.actions.builtin import register_builtins
from orquestador.integrations.http_adapter import http_adapter
from orquestador.integrations.routes import load_routes

ROUTES = """
# A GET that reads, left at the default: never sent in a dry run.
[[route]]
capability = "billing.invoices"
version = 1
effect = "READ_ONLY"
method = "GET"
url = "${BILLING_URL}/v1/invoices"
timeout_seconds = 2
max_attempts = 1
response = { invoices = "/data" }

# The same GET, opted in.
[[route]]
capability = "billing.invoices"
version = 2
effect = "READ_ONLY"
method = "GET"
url = "${BILLING_URL}/v1/invoices"
timeout_seconds = 2
max_attempts = 1
response = { invoices = "/data" }
dry_run = "call"

# A READ_ONLY POST without an example, as the shipped example file had it.
[[route]]
capability = "document.verify"
version = 1
method = "POST"
url = "${KYC_URL}/v2/verifications"
max_attempts = 1

# A READ_ONLY POST with an example: the example answers.
[[route]]
capability = "kyc.screen"
version = 1
effect = "READ_ONLY"
method = "POST"
url = "${KYC_URL}/v2/verifications"
timeout_seconds = 2
max_attempts = 1
output_schema = { type = "object", required = ["status"] }
example = { status = "VERIFIED", reasons = [], reference = "ver_example" }

# The same POST, opted in.
[[route]]
capability = "kyc.screen"
version = 2
effect = "READ_ONLY"
method = "POST"
url = "${KYC_URL}/v2/verifications"
timeout_seconds = 2
max_attempts = 1
output_schema = { type = "object", required = ["status"] }
dry_run = "call"
"""

DOCUMENT = {
    "documentType": {"const": "passport"},
    "documentNumber": {"const": "P1234567"},
    "country": {"const": "ES"},
}


class Balance:
    """An operator's READ_ONLY adapter without simulate: it reads the provider over HTTP."""

    def __init__(self, provider: RouteProvider) -> None:
        self.provider = provider
        self.invoked = 0

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        self.invoked += 1
        answer = requests.get(f"{self.provider.url}/v1/invoices", timeout=ctx.seconds_left())
        return {"invoices": answer.json()["data"]}

    def adapter(self, version: int, **declared: Any) -> Adapter:
        return Adapter(
            capability="test.balance",
            version=version,
            effect=Effect.READ_ONLY,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=2,
            max_attempts=1,
            invoke=self.invoke,
            **declared,
        )


@pytest.fixture
def provider() -> Iterator[RouteProvider]:
    with RouteProvider().serve() as served:
        yield served


@pytest.fixture
def balance(provider: RouteProvider) -> Balance:
    return Balance(provider)


@pytest.fixture
def registry(database, provider: RouteProvider, balance: Balance, tmp_path) -> AdapterRegistry:
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn))
    path = tmp_path / "integrations.toml"
    path.write_text(ROUTES)
    environ = {"BILLING_URL": provider.url, "KYC_URL": provider.url}
    for route in load_routes(path, environ, lease_seconds=30):
        registry.add(http_adapter(route))
    registry.add(balance.adapter(1))
    registry.add(balance.adapter(2, dry_run="call"))
    return registry


@pytest.fixture
def api(database, registry: AdapterRegistry) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=registry) as api:
        yield api


def _dry_run_of(
    api: Api, runtime_engine: Engine, registry: AdapterRegistry, step: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Publish a one-step flow, dry-run it with a worker: (the view, the step's output)."""
    flow_id = api.publish(flow_definition([step]))["id"]
    body = {"data": {}, "transition": "go"}
    view = dry_run_with_worker(api, runtime_engine, registry, flow_id, body)
    assert view["simulation"] is True
    with runtime_engine.connect() as connection:
        output = connection.execute(
            text("SELECT output FROM action_execution WHERE execution_id = :id"),
            {"id": view["id"]},
        ).scalar_one()
    return view, output


@pytest.mark.parametrize(
    "capability, version, inputs",
    [
        ("billing.invoices", 1, {}),
        ("document.verify", 1, DOCUMENT),
        ("test.balance", 1, {}),
    ],
    ids=["GET route", "POST route", "operator adapter"],
)
def test_a_read_that_does_not_opt_in_is_not_called_and_fails_simulation_unsupported(
    api: Api,
    runtime_engine: Engine,
    registry: AdapterRegistry,
    provider: RouteProvider,
    balance: Balance,
    capability: str,
    version: int,
    inputs: dict[str, Any],
) -> None:
    step = action("read", capability, version, input=inputs)

    view, output = _dry_run_of(api, runtime_engine, registry, step)

    assert provider.received == [], "a dry run called the provider"
    assert balance.invoked == 0
    assert (view["status"], view["errorCode"]) == ("FAILED", "SIMULATION_UNSUPPORTED"), json.dumps(
        view, indent=1
    )
    assert output is None


def test_a_read_only_post_route_with_an_example_answers_it_and_sends_nothing(
    api: Api, runtime_engine: Engine, registry: AdapterRegistry, provider: RouteProvider
) -> None:
    step = action("screen", "kyc.screen", 1, input=DOCUMENT)

    view, output = _dry_run_of(api, runtime_engine, registry, step)

    assert view["status"] == "SUCCEEDED", json.dumps(view, indent=1)
    assert output == {"status": "VERIFIED", "reasons": [], "reference": "ver_example"}
    assert provider.received == []
    assert [(d["actionId"], d["capability"]) for d in view["wouldHaveDone"]] == [
        ("screen", "kyc.screen")
    ]


@pytest.mark.parametrize(
    "capability, inputs, method, path",
    [
        ("billing.invoices", {}, "GET", "/v1/invoices"),
        ("kyc.screen", DOCUMENT, "POST", "/v2/verifications"),
        ("test.balance", {}, "GET", "/v1/invoices"),
    ],
    ids=["GET route", "POST route", "operator adapter"],
)
def test_a_read_that_opts_in_is_called_for_real_in_a_dry_run(
    api: Api,
    runtime_engine: Engine,
    registry: AdapterRegistry,
    provider: RouteProvider,
    capability: str,
    inputs: dict[str, Any],
    method: str,
    path: str,
) -> None:
    step = action("read", capability, 2, input=inputs)

    view, output = _dry_run_of(api, runtime_engine, registry, step)

    assert view["status"] == "SUCCEEDED", json.dumps(view, indent=1)
    assert [(r.method, r.path) for r in provider.received] == [(method, path)]
    assert output is not None and output != {}
    # A real read, not a simulation: nothing to list under wouldHaveDone.
    assert view["wouldHaveDone"] == []


def test_a_route_invoked_directly_in_a_simulation_sends_nothing_unless_it_opts_in(
    registry: AdapterRegistry, provider: RouteProvider
) -> None:
    # The engine never invokes such a route in a dry run; the route refuses it as well.
    def simulated() -> ActionContext:
        deadline = time.monotonic() + 2
        return ActionContext({}, "e:a", 1, deadline, Identity("o", "r", "e"), simulation=True)

    for capability in ("billing.invoices", "document.verify"):
        with pytest.raises(PermanentError) as refused:
            registry.get(capability, 1).invoke(simulated())
        assert refused.value.code == "SIMULATION_UNSUPPORTED"
    assert provider.received == []
    assert registry.get("billing.invoices", 2).invoke(simulated()) == {"invoices": []}
    assert [(r.method, r.path) for r in provider.received] == [("GET", "/v1/invoices")]
