"""The trusted adapter catalog: adapters by capability and version."""

from __future__ import annotations

from orquestador.actions.contracts import Adapter
from orquestador.errors import ConfigError, IntegrationUnavailable


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
