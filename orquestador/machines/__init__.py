"""Machine commands: the rows a flow writes and a machine's agent takes, runs and reports."""

from orquestador.machines.cancel import CancelledCommands, cancel_for_execution
from orquestador.machines.commands import (
    FINAL,
    AgentCommand,
    Command,
    CommandNotFound,
    StatusConflict,
    claim_next,
    create_command,
    find_command,
    report_status,
    wait_key,
)
from orquestador.machines.long_poll import next_command
from orquestador.machines.retention import delete_final_commands

__all__ = [
    "FINAL",
    "AgentCommand",
    "CancelledCommands",
    "Command",
    "CommandNotFound",
    "StatusConflict",
    "cancel_for_execution",
    "claim_next",
    "create_command",
    "delete_final_commands",
    "find_command",
    "next_command",
    "report_status",
    "wait_key",
]
