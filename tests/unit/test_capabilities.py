"""What publishing asks the adapter registry about each capability a flow names."""

from __future__ import annotations

from orquestador.actions import Adapter, AdapterRegistry, Effect
from orquestador.api.capabilities import capability_checker
from orquestador.config import Settings


class _Knows:
    def knows(self, capability: str, version: int) -> bool:
        return (capability, version) == ("acme.invoice", 1)


def test_the_configured_registry_refuses_unknown_capabilities_and_dry_run_only_adapters():
    problem = capability_checker(Settings.from_env({}))
    assert problem("acme.invoice", 1) == "unknown capability acme.invoice version 1"
    assert problem("noop", 1) == (
        "noop version 1 only simulates and never runs for real; a published flow cannot use it"
    )


def test_an_adapter_that_runs_for_real_is_accepted():
    registry = AdapterRegistry()
    registry.add(
        Adapter(
            capability="acme.invoice",
            version=1,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=1,
            max_attempts=1,
            invoke=lambda ctx: {},
        )
    )
    problem = capability_checker(Settings.from_env({}), registry)
    assert problem("acme.invoice", 1) is None
    assert problem("acme.invoice", 2) == "unknown capability acme.invoice version 2"


def test_a_stand_in_registry_answers_only_what_it_knows():
    problem = capability_checker(Settings.from_env({}), _Knows())
    assert problem("acme.invoice", 1) is None
    assert problem("noop", 1) == "unknown capability noop version 1"
