"""A dry run through the API and a real worker: writers never invoked, wouldHaveDone listed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import ORG, Api, running_api
from automation_support import count
from notice_support import set_preferences
from route_provider import RouteProvider
from sqlalchemy import Engine, text
from worker_support import dry_run_with_worker, settings

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect
from orquestador.actions.builtin import register_builtins
from orquestador.integrations.http_adapter import http_adapter
from orquestador.integrations.routes import load_routes

# Power a machine off, then charge for it: a command row and an invoice, were it real.
CHARGED_POWER_OFF: dict[str, Any] = {
    "key": "charged-power-off",
    "trigger": "manual",
    "dataSchema": {
        "type": "object",
        "required": ["machineId"],
        "properties": {"machineId": {"type": "string"}},
    },
    "initialState": "new",
    "states": ["new", "off", "attention"],
    "transitions": [
        {
            "id": "power-off",
            "from": ["new"],
            "actions": [
                {
                    "id": "send",
                    "capability": "machine.command",
                    "version": 1,
                    "input": {
                        "machineId": {"from": "/data/machineId"},
                        "command": {"const": "poweroff"},
                    },
                    "onError": "attention",
                },
                {
                    "id": "wait",
                    "capability": "machine.wait",
                    "version": 1,
                    "input": {
                        "commandId": {"from": "/actions/send/commandId"},
                        "deadlineSeconds": {"const": 30},
                    },
                    "onError": "attention",
                },
                {
                    "id": "charge",
                    "capability": "test.charge",
                    "version": 1,
                    "input": {"machineId": {"from": "/data/machineId"}},
                },
                {
                    "id": "invoice",
                    "capability": "billing.invoice",
                    "version": 1,
                    "input": {"amount": {"const": 42}},
                },
                {
                    "id": "tell",
                    "capability": "notify",
                    "version": 1,
                    "email": True,
                    "input": {
                        "title": {"const": "Machine off"},
                        "body": {"const": "m-1 was powered off"},
                    },
                },
            ],
            "decision": {
                "hitPolicy": "FIRST",
                "inputs": ["/actions/wait/status"],
                "rules": [
                    {"id": "ok", "when": ['"succeeded"'], "then": {"to": "off"}},
                    {"id": "other", "when": ["-"], "then": {"to": "attention"}},
                ],
            },
        }
    ],
}


class Charge:
    """A writer whose invoke must never run in a dry run: it raises, and counts."""

    def __init__(self) -> None:
        self.invoked = 0
        self.simulated = 0
        self._lock = threading.Lock()

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        with self._lock:
            self.invoked += 1
        raise AssertionError("a dry run invoked a writer")

    def simulate(self, ctx: ActionContext) -> dict[str, Any]:
        with self._lock:
            self.simulated += 1
        ctx.observe({"summary": f"would charge for machine {ctx.inputs['machineId']}"})
        return {"invoiceId": "simulated"}

    def adapter(self) -> Adapter:
        return Adapter(
            capability="test.charge",
            version=1,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=5,
            max_attempts=1,
            invoke=self.invoke,
            simulate=self.simulate,
        )


@pytest.fixture
def charge() -> Charge:
    return Charge()


# An operator's HTTP route with the example a dry run answers instead of calling.
INVOICE_ROUTE = """
[[route]]
capability = "billing.invoice"
version = 1
effect = "NON_IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/invoices"
timeout_seconds = 2
max_attempts = 1
input_schema = { type = "object", required = ["amount"] }
output_schema = { type = "object", required = ["id"] }
response = { id = "/id" }
example = { id = "inv_example" }
"""


@pytest.fixture
def provider() -> Iterator[RouteProvider]:
    with RouteProvider().serve() as served:
        yield served


@pytest.fixture
def registry(database, charge: Charge, provider: RouteProvider, tmp_path) -> AdapterRegistry:
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn))
    registry.add(charge.adapter())
    path = tmp_path / "integrations.toml"
    path.write_text(INVOICE_ROUTE)
    for route in load_routes(path, {"BILLING_URL": provider.url}, lease_seconds=30):
        registry.add(http_adapter(route))
    return registry


@pytest.fixture
def api(database, registry: AdapterRegistry) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=registry) as api:
        yield api


def _dry_run(
    api: Api, engine: Engine, registry: AdapterRegistry, flow: dict[str, Any], transition: str
) -> dict[str, Any]:
    """Publish `flow`, dry-run `transition` on machine m-1 with a worker: the finished view."""
    flow_id = api.publish(flow)["id"]
    body = {"data": {"machineId": "m-1"}, "transition": transition}
    view = dry_run_with_worker(api, engine, registry, flow_id, body)
    assert view["status"] == "SUCCEEDED", json.dumps(view, indent=1)
    return view


def test_a_dry_run_completes_with_would_have_done_and_touches_nothing(
    api: Api,
    runtime_engine: Engine,
    registry: AdapterRegistry,
    charge: Charge,
    provider: RouteProvider,
) -> None:
    # Everything a real run would need to write: e-mail recipients, a provider.
    with runtime_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO notification_preference (org_id, recipients)"
                " VALUES (:org, '[\"ops@example.com\"]')"
            ),
            {"org": ORG},
        )
    view = _dry_run(api, runtime_engine, registry, CHARGED_POWER_OFF, "power-off")
    assert view["simulation"] is True
    assert [(d["actionId"], d["capability"], d["effect"]) for d in view["wouldHaveDone"]] == [
        ("send", "machine.command", "IDEMPOTENT_WRITE"),
        ("wait", "machine.wait", "READ_ONLY"),
        ("charge", "test.charge", "NON_IDEMPOTENT_WRITE"),
        ("invoice", "billing.invoice", "NON_IDEMPOTENT_WRITE"),
        ("tell", "notify", "IDEMPOTENT_WRITE"),
    ]
    assert view["wouldHaveDone"][2]["summary"] == "would charge for machine m-1"
    # The node ticked e-mail: the dry run says the real run would send it.
    assert (
        view["wouldHaveDone"][4]["summary"] == "would notify: Machine off; would e-mail 1 recipient"
    )
    # What it would have sent, as facts: the machine and command, the recipients.
    assert view["wouldHaveDone"][0]["wouldSend"] == {
        "machineId": "m-1",
        "command": "poweroff",
        "args": [],
    }
    assert view["wouldHaveDone"][4]["wouldSend"] == {
        "email": "queued",
        "recipients": ["ops@example.com"],
    }
    assert (charge.invoked, charge.simulated) == (0, 1)
    # Nothing reached the world: no command row, no provider call, no e-mail queued;
    # the notice is written, marked as a test.
    assert count(runtime_engine, "machine_command") == 0
    assert provider.received == []
    assert count(runtime_engine, "email_outbox") == 0
    with runtime_engine.connect() as connection:
        notices = connection.execute(text("SELECT test, email FROM panel_notice")).all()
    assert [tuple(n) for n in notices] == [(True, "simulation")]
    with runtime_engine.connect() as connection:
        request = connection.execute(text("SELECT state, simulation FROM request")).one()
    assert tuple(request) == ("off", True)


def _ask_then_tell(*, approval_email: bool) -> dict[str, Any]:
    """Ask for a yes (by name or by scope), then tell the organization, mailing it."""
    ask: dict[str, Any] = {
        "id": "ask",
        "capability": "approval",
        "version": 1,
        "input": {
            "title": {"const": "Reboot m-1?"},
            "approvers": {"const": {"subjects": ["bob"], "scope": "ops:lead"}},
            "deadlineSeconds": {"const": 3600},
        },
    }
    if approval_email:
        ask["email"] = True
    tell = {
        "id": "tell",
        "capability": "notify",
        "version": 1,
        "email": True,
        "input": {"title": {"const": "Rebooting m-1"}, "body": {"const": "approved"}},
    }
    return {
        "key": "ask-then-tell",
        "trigger": "manual",
        "dataSchema": {"type": "object", "properties": {"machineId": {"type": "string"}}},
        "initialState": "new",
        "states": ["new", "rebooting", "refused"],
        "transitions": [
            {
                "id": "reboot",
                "from": ["new"],
                "actions": [ask, tell],
                "decision": {
                    "hitPolicy": "FIRST",
                    "inputs": ["/actions/ask/decision"],
                    "rules": [
                        {"id": "yes", "when": ['"approved"'], "then": {"to": "rebooting"}},
                        {"id": "no", "when": ["-"], "then": {"to": "refused"}},
                    ],
                },
            }
        ],
    }


def _done(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["actionId"]: d for d in view["wouldHaveDone"]}


def test_under_the_organizations_opt_out_would_send_says_so_and_names_no_recipients(
    api: Api, runtime_engine: Engine, registry: AdapterRegistry
) -> None:
    # Recipients are configured: only the opt-out keeps a real run from mailing them.
    set_preferences(runtime_engine, ORG, opt_out=["automation"], recipients=["ops@example.com"])
    done = _done(
        _dry_run(api, runtime_engine, registry, _ask_then_tell(approval_email=True), "reboot")
    )

    assert done["tell"]["wouldSend"] == {"email": "org_opted_out", "recipients": []}
    assert done["tell"]["summary"] == (
        "would notify: Rebooting m-1; no e-mail: the organization opted out of automation e-mail"
    )
    assert done["ask"]["wouldSend"] == {
        "approvers": {"subjects": ["bob"], "scope": "ops:lead"},
        "email": "org_opted_out",
        "recipients": [],
    }
    assert done["ask"]["summary"] == (
        "would ask bob or anyone holding ops:lead to approve: Reboot m-1?;"
        " no e-mail (org_opted_out)"
    )
    assert count(runtime_engine, "email_outbox") == 0


@pytest.mark.parametrize("email", [True, False], ids=["email-ticked", "email-off"])
def test_an_approval_steps_would_send_names_its_approvers_and_whom_it_would_mail(
    api: Api, runtime_engine: Engine, registry: AdapterRegistry, email: bool
) -> None:
    set_preferences(runtime_engine, ORG, recipients=["ops@example.com", "oncall@example.com"])
    view = _dry_run(api, runtime_engine, registry, _ask_then_tell(approval_email=email), "reboot")
    ask = _done(view)["ask"]

    assert (ask["capability"], ask["effect"]) == ("approval", "READ_ONLY")
    recipients = ["ops@example.com", "oncall@example.com"] if email else []
    assert ask["wouldSend"] == {
        "approvers": {"subjects": ["bob"], "scope": "ops:lead"},
        "email": "queued" if email else "off_on_node",
        "recipients": recipients,
    }
    mailed = (
        "would e-mail ops@example.com, oncall@example.com" if email else "no e-mail (off_on_node)"
    )
    assert (
        ask["summary"]
        == f"would ask bob or anyone holding ops:lead to approve: Reboot m-1?; {mailed}"
    )
    # Nobody was asked: no approval row, no e-mail; the step was approved by the dry run.
    assert count(runtime_engine, "approval") == 0
    assert count(runtime_engine, "email_outbox") == 0
