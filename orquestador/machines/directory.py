"""The organization's machines as operators read them: each machine with its agent's
liveness and its commands under way, a machine's recent commands, a command's output.

A machine is any id the organization's records name: an agent that showed itself, an
enrolled credential, a command sent to it. Every statement names the organization (and
the machine): another organization's machine or command is indistinguishable from a
missing one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from orquestador.db.sql_literals import quoted
from orquestador.domain.statuses import UNDER_WAY_COMMAND
from orquestador.machines.commands import FINAL, stored_output
from orquestador.machines.liveness import AgentSeen, agent_of, agents_seen
from orquestador.machines.output import StoredOutput

# Every machine id the organization's records name, once, after a cursor. The command
# ids come from the (org_id, machine_id, status) index: one probe per machine.
_MACHINE_IDS = text(
    """
    SELECT machine_id FROM (
        SELECT machine_id FROM machine_agent WHERE org_id = :org_id
        UNION SELECT machine_id FROM machine_credential WHERE org_id = :org_id
        UNION SELECT machine_id FROM machine_command WHERE org_id = :org_id
    ) AS named
    WHERE CAST(:after AS text) IS NULL OR machine_id > CAST(:after AS text)
    ORDER BY machine_id
    LIMIT :limit
    """
)

# Per machine: its newest command's time, its commands under way, its valid credentials.
_FACTS = text(
    f"""
    SELECT m.machine_id,
           (SELECT max(c.created_at) FROM machine_command c
            WHERE c.org_id = :org_id AND c.machine_id = m.machine_id) AS last_command_at,
           (SELECT count(*) FROM machine_command c
            WHERE c.org_id = :org_id AND c.machine_id = m.machine_id
              AND c.status IN ({quoted(UNDER_WAY_COMMAND)})) AS under_way,
           (SELECT count(*) FROM machine_credential k
            WHERE k.org_id = :org_id AND k.machine_id = m.machine_id
              AND k.revoked_at IS NULL AND k.expires_at > clock_timestamp()) AS credentials
    FROM unnest(CAST(:machine_ids AS text[])) AS m(machine_id)
    """
)


@dataclass(frozen=True)
class Machine:
    """A machine as an operator sees it."""

    id: str
    agent: AgentSeen
    last_command_at: datetime | None
    commands_under_way: int
    valid_credentials: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent": self.agent.as_json(),
            "lastCommandAt": None
            if self.last_command_at is None
            else self.last_command_at.isoformat(),
            "commandsUnderWay": self.commands_under_way,
            "validCredentials": self.valid_credentials,
        }


def list_machines(
    conn: Connection, *, org_id: str, offline_seconds: float, limit: int, after: str | None
) -> list[Machine]:
    """Up to `limit` of the organization's machines by id, after the cursor `after`."""
    ids = [
        row.machine_id
        for row in conn.execute(_MACHINE_IDS, {"org_id": org_id, "after": after, "limit": limit})
    ]
    return _machines(conn, org_id=org_id, machine_ids=ids, offline_seconds=offline_seconds)


def find_machine(
    conn: Connection, *, org_id: str, machine_id: str, offline_seconds: float
) -> Machine | None:
    """The organization's machine, or None when nothing of the organization names it."""
    named = conn.execute(
        text(
            """
            SELECT 1 WHERE EXISTS (SELECT 1 FROM machine_agent
                                   WHERE org_id = :org_id AND machine_id = :machine_id)
                OR EXISTS (SELECT 1 FROM machine_credential
                           WHERE org_id = :org_id AND machine_id = :machine_id)
                OR EXISTS (SELECT 1 FROM machine_command
                           WHERE org_id = :org_id AND machine_id = :machine_id)
            """
        ),
        {"org_id": org_id, "machine_id": machine_id},
    ).first()
    if named is None:
        return None
    [machine] = _machines(
        conn, org_id=org_id, machine_ids=[machine_id], offline_seconds=offline_seconds
    )
    return machine


def _machines(
    conn: Connection, *, org_id: str, machine_ids: list[str], offline_seconds: float
) -> list[Machine]:
    if not machine_ids:
        return []
    seen = agents_seen(
        conn, org_id=org_id, machine_ids=machine_ids, offline_seconds=offline_seconds
    )
    facts = {
        row.machine_id: row
        for row in conn.execute(_FACTS, {"org_id": org_id, "machine_ids": machine_ids})
    }
    return [
        Machine(
            id=machine_id,
            agent=agent_of(seen, machine_id, offline_seconds),
            last_command_at=facts[machine_id].last_command_at,
            commands_under_way=int(facts[machine_id].under_way),
            valid_credentials=int(facts[machine_id].credentials),
        )
        for machine_id in machine_ids
    ]


# A machine's commands, newest first, with the execution that sent each (its external
# key is the step's: "<execution id>:<action id>").
_COMMANDS = text(
    """
    SELECT id, command, args, status, exit_code, created_at, updated_at, sent_at,
           finished_at, cancel_requested_at, deliver_by, external_key, output_size,
           output_size - coalesce(octet_length(output), 0)
               - coalesce(octet_length(output_tail), 0) AS output_dropped
    FROM machine_command
    WHERE org_id = :org_id AND machine_id = :machine_id
    ORDER BY created_at DESC, id DESC
    LIMIT :limit
    """
)


def machine_commands(
    conn: Connection, *, org_id: str, machine_id: str, limit: int
) -> list[dict[str, Any]]:
    """The machine's newest `limit` commands, as the API lists them."""
    rows = conn.execute(_COMMANDS, {"org_id": org_id, "machine_id": machine_id, "limit": limit})
    return [_command_view(row) for row in rows]


def _command_view(row: Any) -> dict[str, Any]:
    execution_id, _, action_id = row.external_key.partition(":")
    return {
        "id": str(row.id),
        "command": row.command,
        "args": list(row.args or []),
        "status": row.status,
        "exitCode": row.exit_code,
        "createdAt": row.created_at.isoformat(),
        "sentAt": _when(row.sent_at),
        "finishedAt": _when(row.finished_at),
        "deliverBy": row.deliver_by.isoformat(),
        "stopRequestedAt": _when(row.cancel_requested_at),
        "outputBytes": row.output_size,
        "outputTruncated": row.output_dropped > 0,
        "executionId": execution_id,
        "actionId": action_id,
    }


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


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
