"""The adapter contracts a flow is checked against when it is published."""

from __future__ import annotations

from typing import Any

from orquestador.actions.builtin import rollout
from orquestador.actions.contracts import Effect
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings
from orquestador.domain.action_contracts import ActionContract, ConstantProblem, ContractOf

# The adapters whose constant inputs are held to more than their schema: machine.command
# to an operator setting, rollout to the organization's quota rolloutItems.
MACHINE_COMMAND = ("machine.command", 1)
ROLLOUT = (rollout.CAPABILITY, 1)


def _allowed_command(allowed: list[str]) -> ConstantProblem:
    def problem(name: str, value: Any) -> str | None:
        # The same allow-list machine.command@1 checks at run time, from the same setting.
        if name != "command" or not isinstance(value, str) or value in allowed:
            return None
        return (
            f"command {value!r} is not in MACHINE_COMMANDS "
            f"({', '.join(sorted(allowed)) or 'empty'}); it could only fail COMMAND_NOT_ALLOWED"
        )

    return problem


def contract_lookup(settings: Settings, registry: AdapterRegistry, *, org: str) -> ContractOf:
    """The declared contract of each (capability, version) the registry has, else None,
    for a flow `org` publishes."""
    commands = _allowed_command(settings.machine_command_list)
    items = rollout.constant_problem(settings.quotas_for(org).rollout_items)

    def contract_of(capability: str, version: int) -> ActionContract | None:
        if not registry.knows(capability, version):
            return None
        adapter = registry.get(capability, version)
        constant_problem = {MACHINE_COMMAND: commands, ROLLOUT: items}
        return ActionContract(
            input_schema=adapter.input_schema,
            output_schema=adapter.output_schema,
            constant_problem=constant_problem.get((capability, version)),
            reads_only=adapter.effect is Effect.READ_ONLY,
        )

    return contract_of
