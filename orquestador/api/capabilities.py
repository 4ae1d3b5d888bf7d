"""Which capabilities a flow may name: the adapter registry's answer, looked up in one place."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from orquestador.config import Settings

log = logging.getLogger(__name__)

CapabilityKnown = Callable[[str, int], bool]


class KnowsCapabilities(Protocol):
    def knows(self, capability: str, version: int) -> bool: ...


def _accept_any(capability: str, version: int) -> bool:
    return True


def capability_checker(
    settings: Settings, registry: KnowsCapabilities | None = None
) -> CapabilityKnown:
    """The registry's `knows`; with no registry given, the one ADAPTER_MODULES configures.

    While the adapter package is incomplete (a module of it cannot be imported),
    publishing accepts any capability and the worker reports the missing adapter
    as INTEGRATION_UNAVAILABLE when it runs.
    """
    if registry is None:
        try:
            from orquestador.actions import load_registry

            registry = load_registry(settings)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("orquestador.actions"):
                raise
            log.warning("adapter registry unavailable (%s); any capability is accepted", exc.name)
            return _accept_any
    return registry.knows
