"""Built-in adapters: NO_OP (dry runs and benchmarks), machines, notices, approvals, rollouts.

Built-ins that keep state (machine commands, notices) reach the database through
`BuiltinDatabase`, created on first use, so a process that only checks capabilities
(the API publishing a flow) never connects for them.
"""

from __future__ import annotations

from orquestador.actions.builtin import approval, machine, notify, rollout
from orquestador.actions.builtin.database import BuiltinDatabase
from orquestador.actions.builtin.noop import NOOP
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings


def register_builtins(registry: AdapterRegistry, settings: Settings | None = None) -> None:
    registry.add(NOOP)
    if settings is None:
        return
    database = BuiltinDatabase(settings.database_url, prepare=settings.db_prepare)
    machine.register(registry, settings, database)
    notify.register(registry, settings, database)
    approval.register(registry, settings, database)
    rollout.register(registry, settings, database)
