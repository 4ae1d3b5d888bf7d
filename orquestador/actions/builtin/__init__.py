"""Built-in adapters; the default catalog holds only what needs no operator configuration."""

from __future__ import annotations

from orquestador.actions.builtin.noop import NOOP
from orquestador.actions.registry import AdapterRegistry


def register_builtins(registry: AdapterRegistry) -> None:
    registry.add(NOOP)
