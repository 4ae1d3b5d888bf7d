"""Which capabilities a flow may name: the adapter registry's answer, looked up in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from orquestador.actions import AdapterRegistry, load_registry
from orquestador.config import Settings

# Why a published flow may not name (capability, version), or None when it may.
CapabilityProblem = Callable[[str, int], str | None]


class KnowsCapabilities(Protocol):
    def knows(self, capability: str, version: int) -> bool: ...


def capability_checker(
    settings: Settings, registry: KnowsCapabilities | None = None
) -> CapabilityProblem:
    """The publishing check of each action's capability; with no registry, the configured one.

    A capability the registry does not know is refused. So is an adapter that runs
    only in simulation (NO_OP, for benchmarks): a published flow naming it could only
    fail SIMULATION_ONLY when run for real. A stand-in registry that
    only answers `knows` has no adapters, hence none that runs only in dry runs.
    """
    known = registry if registry is not None else load_registry(settings)

    def problem(capability: str, version: int) -> str | None:
        if not known.knows(capability, version):
            return f"unknown capability {capability} version {version}"
        if isinstance(known, AdapterRegistry) and known.get(capability, version).simulation_only:
            return (
                f"{capability} version {version} only simulates and never runs for real;"
                " a published flow cannot use it"
            )
        return None

    return problem
