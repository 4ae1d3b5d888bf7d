"""The adapter registry: versions, duplicates, unknown capabilities, operator modules, NO_OP."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    Identity,
    PermanentError,
    load_registry,
)
from orquestador.actions.builtin.noop import NOOP
from orquestador.config import Settings
from orquestador.errors import ConfigError, IntegrationUnavailable


def _adapter(capability: str = "acme.invoice", version: int = 1, **kw) -> Adapter:
    values = dict(
        effect=Effect.NON_IDEMPOTENT_WRITE,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        timeout_seconds=10,
        max_attempts=1,
        invoke=lambda ctx: {},
    )
    values.update(kw)
    return Adapter(capability=capability, version=version, **values)


def test_adapters_are_found_by_capability_and_version():
    registry = AdapterRegistry()
    registry.add(_adapter(version=1))
    registry.add(_adapter(version=2))
    assert registry.get("acme.invoice", 2).version == 2
    assert registry.knows("acme.invoice", 1) and not registry.knows("acme.invoice", 3)


def test_a_duplicate_is_refused():
    registry = AdapterRegistry()
    registry.add(_adapter())
    with pytest.raises(ValueError, match="already registered"):
        registry.add(_adapter())


def test_an_unknown_capability_is_integration_unavailable():
    with pytest.raises(IntegrationUnavailable) as caught:
        AdapterRegistry().get("acme.invoice", 1)
    assert caught.value.code == "INTEGRATION_UNAVAILABLE"


def test_effect_accepts_its_database_spelling():
    assert _adapter(effect="READ_ONLY").effect is Effect.READ_ONLY
    assert Effect.IDEMPOTENT_WRITE.value == "IDEMPOTENT_WRITE"


def test_timeouts_must_be_finite_and_below_the_lease():
    with pytest.raises(ValueError):
        _adapter(timeout_seconds=0)
    registry = AdapterRegistry()
    registry.add(_adapter(timeout_seconds=60))
    with pytest.raises(ConfigError, match="not below"):
        registry.check_timeouts_below(60)
    registry.check_timeouts_below(61)


def test_only_a_read_without_simulate_may_be_called_in_a_dry_run():
    assert _adapter().dry_run == "simulate"
    assert _adapter(effect=Effect.READ_ONLY, dry_run="call").dry_run == "call"
    for effect in (Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE):
        with pytest.raises(ValueError, match="dry_run='call' is for READ_ONLY adapters"):
            _adapter(effect=effect, dry_run="call")
    with pytest.raises(ValueError, match="both simulate and dry_run='call'"):
        _adapter(effect=Effect.READ_ONLY, dry_run="call", simulate=lambda ctx: {})
    with pytest.raises(ValueError, match="dry_run must be 'simulate' or 'call'"):
        _adapter(effect=Effect.READ_ONLY, dry_run="sometimes")
    # noop calls nothing, so it is the one built-in a dry run calls as it is.
    assert NOOP.dry_run == "call"


def test_load_registry_holds_only_noop_by_default_and_loads_operator_modules():
    assert [a.key for a in load_registry(Settings.from_env({})).adapters()] == [
        "noop@1",
        "machine.command@1",
        "machine.wait@1",
        "notify@1",
        "approval@1",
        "rollout@1",
    ]
    module = types.ModuleType("orq_test_operator_adapters")
    module.register = lambda registry: registry.add(_adapter())
    sys.modules[module.__name__] = module
    try:
        registry = load_registry(Settings.from_env({"ADAPTER_MODULES": module.__name__}))
    finally:
        del sys.modules[module.__name__]
    assert registry.knows("acme.invoice", 1)


def test_a_module_that_fails_to_import_is_named():
    with pytest.raises(ConfigError, match="orq_no_such_module"):
        load_registry(Settings.from_env({"ADAPTER_MODULES": "orq_no_such_module"}))


def test_noop_refuses_a_real_execution():
    ctx = ActionContext(
        {},
        "e:a",
        1,
        time.monotonic() + 1,
        Identity("o", "r", "e"),
        simulation=False,
        stop_event=threading.Event(),
    )
    with pytest.raises(PermanentError) as caught:
        NOOP.invoke(ctx)
    assert caught.value.code == "SIMULATION_ONLY"
    assert (
        NOOP.invoke(ActionContext({}, "e:a", 1, 0.0, Identity("o", "r", "e"), simulation=True))
        == {}
    )
