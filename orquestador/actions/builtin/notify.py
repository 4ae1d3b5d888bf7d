"""Built-in adapter(s) of this area; registered by register_builtins."""

from __future__ import annotations

from orquestador.actions.builtin.database import BuiltinDatabase
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings


def register(registry: AdapterRegistry, settings: Settings, database: BuiltinDatabase) -> None:
    return None
