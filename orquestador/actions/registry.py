"""The trusted adapter catalog: built-ins plus operator modules named in ADAPTER_MODULES."""

from __future__ import annotations

import importlib
import logging

from orquestador.actions.contracts import Adapter
from orquestador.config import Settings
from orquestador.errors import ConfigError, IntegrationUnavailable

log = logging.getLogger(__name__)


class AdapterRegistry:
    """Adapters by (capability, version); a capability nobody registered is unavailable."""

    def __init__(self) -> None:
        self._adapters: dict[tuple[str, int], Adapter] = {}

    def add(self, adapter: Adapter) -> None:
        key = (adapter.capability, adapter.version)
        if key in self._adapters:
            raise ValueError(f"adapter {adapter.key} is already registered")
        self._adapters[key] = adapter

    def get(self, capability: str, version: int) -> Adapter:
        try:
            return self._adapters[(capability, version)]
        except KeyError:
            raise IntegrationUnavailable(
                f"no adapter is configured for {capability}@{version}"
            ) from None

    def knows(self, capability: str, version: int) -> bool:
        return (capability, version) in self._adapters

    def adapters(self) -> list[Adapter]:
        return list(self._adapters.values())

    def check_timeouts_below(self, lease_seconds: float) -> None:
        """Refuse adapters that could outlive the lease: their writes would race a new owner."""
        problems = [
            f"adapter {a.key} has timeout_seconds={a.timeout_seconds}, which is not below "
            f"WORKER_LEASE_SECONDS={lease_seconds}"
            for a in self._adapters.values()
            if not a.timeout_seconds < lease_seconds
        ]
        if problems:
            raise ConfigError(problems)


def load_registry(settings: Settings) -> AdapterRegistry:
    """Register the built-in adapters, then call `register(registry)` of each operator module."""
    from orquestador.actions.builtin import register_builtins

    registry = AdapterRegistry()
    register_builtins(registry)
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
