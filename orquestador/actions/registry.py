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
        """Refuse adapters that could outlive the lease: their writes would race a new owner.

        A lookup's answer is written like a call's, so its timeout is held to the same bound.
        """
        problems = []
        for a in self._adapters.values():
            for name, seconds in timeouts_of(a):
                if not seconds < lease_seconds:
                    problems.append(
                        f"adapter {a.key} has {name}={seconds}, which is not below "
                        f"WORKER_LEASE_SECONDS={lease_seconds}"
                    )
        if problems:
            raise ConfigError(problems)


def timeouts_of(adapter: Adapter) -> list[tuple[str, float]]:
    """Every finite wait an adapter declares, by its field name: the call's and the lookup's."""
    found = [("timeout_seconds", adapter.timeout_seconds)]
    if adapter.lookup is not None and adapter.lookup_timeout_seconds is not None:
        found.append(("lookup_timeout_seconds", adapter.lookup_timeout_seconds))
    return found
