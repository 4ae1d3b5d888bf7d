"""The organization's machines as operators read them: a command's output, by offset.

Every statement names the organization and the machine: a command of another
organization or machine is indistinguishable from a missing one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, text

from orquestador.machines.commands import FINAL, stored_output
from orquestador.machines.output import StoredOutput

_OUTPUT = text(
    """
    SELECT status, output, output_tail, output_received, output_size
    FROM machine_command
    WHERE org_id = :org_id AND machine_id = :machine_id AND id = :id
    """
)


@dataclass(frozen=True)
class CommandOutput:
    """A command's output as kept, and whether more may come (its status is not final)."""

    stored: StoredOutput
    complete: bool


def command_output(
    conn: Connection, *, org_id: str, machine_id: str, command_id: uuid.UUID
) -> CommandOutput | None:
    """The machine's command's output, or None (missing and foreign alike)."""
    row = conn.execute(
        _OUTPUT, {"org_id": org_id, "machine_id": machine_id, "id": command_id}
    ).one_or_none()
    if row is None:
        return None
    return CommandOutput(stored_output(row), row.status in FINAL)
