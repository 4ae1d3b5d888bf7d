"""What a cancel does to its execution's machine commands: end those not taken, stop the rest.

It runs in the cancel's transaction (queue/reconciliation.py), so the commands change
with the execution or not at all. It also tells the cancel which of the execution's
writes were only a command no agent took (SPEC 23): such a write counts as not done.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from orquestador.db.sql_literals import quoted
from orquestador.domain.statuses import UNDER_WAY_COMMAND, CheckpointStatus, CommandStatus
from orquestador.machines.bell import NEW_COMMAND_CHANNEL, notification_payload

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


@dataclass(frozen=True)
class CancelledCommands:
    """What a cancel did to its execution's commands: ended, or asked to stop."""

    cancelled: list[CancelledCommand]
    stop_requested: list[CancelledCommand]

    def as_json(self) -> dict[str, Any]:
        return {
            "cancelled": [c.as_json() for c in self.cancelled],
            "stopRequested": [c.as_json() for c in self.stop_requested],
        }


@dataclass(frozen=True)
class CancelledCommand:
    id: uuid.UUID
    machine_id: str
    command: str

    def as_json(self) -> dict[str, Any]:
        return {"id": str(self.id), "machineId": self.machine_id, "command": self.command}


# The execution's commands still under way, found by their external key (the step's,
# "<execution id>:<action id>") within the organization. The CTE locks them: a poll
# claiming one at the same moment either took it first (this finds it sent and asks
# the agent to stop) or finds it cancelled and skips it. Pending ones end here, so
# no agent ever receives them; taken ones keep their status until the agent reports.
_CANCEL_FOR_EXECUTION = text(
    f"""
    WITH open AS (
        SELECT id, status FROM machine_command
        WHERE org_id = :org_id AND external_key LIKE :key_prefix
          AND status IN ({quoted(UNDER_WAY_COMMAND)})
        FOR UPDATE
    )
    UPDATE machine_command AS c
    SET status = CASE WHEN open.status = '{CommandStatus.PENDING}' THEN '{CommandStatus.CANCELLED}'
                      ELSE c.status END,
        finished_at = CASE WHEN open.status = '{CommandStatus.PENDING}' THEN clock_timestamp()
                           ELSE c.finished_at END,
        cancel_requested_at = CASE WHEN open.status = '{CommandStatus.PENDING}'
                                   THEN c.cancel_requested_at
                                   ELSE coalesce(c.cancel_requested_at, clock_timestamp()) END,
        updated_at = clock_timestamp()
    FROM open
    WHERE c.id = open.id AND c.status IN ({quoted(UNDER_WAY_COMMAND)})
    RETURNING c.id, c.machine_id, c.command, c.status
    """
)


def cancel_for_execution(
    conn: Connection, *, org_id: str, execution_id: uuid.UUID
) -> CancelledCommands:
    """Cancel the execution's pending commands, ask its agents to stop the taken ones.

    Runs in the cancel's transaction. The agents of machines with a stop to hear are
    rung once it commits, so an agent waiting in a long poll looks again at once.
    """
    rows = conn.execute(
        _CANCEL_FOR_EXECUTION, {"org_id": org_id, "key_prefix": f"{execution_id}:%"}
    ).all()
    cancelled, stop_requested = [], []
    for row in sorted(rows, key=lambda r: (r.machine_id, str(r.id))):
        command = CancelledCommand(row.id, row.machine_id, row.command)
        (cancelled if row.status == CommandStatus.CANCELLED else stop_requested).append(command)
    for machine_id in sorted({c.machine_id for c in stop_requested}):
        conn.execute(
            _NOTIFY,
            {
                "channel": NEW_COMMAND_CHANNEL,
                "payload": notification_payload(org_id, machine_id),
            },
        )
    return CancelledCommands(cancelled, stop_requested)


# The execution's machine.command steps whose only effect, the command, no agent ever
# took and none ever will: final (withdrawn by this cancel a statement earlier, or
# expired) without ever having been handed out. The step's external key is its
# command's: the join finds exactly the row the step wrote. Locked, so no report or
# poll changes them before the cancel commits.
_UNTAKEN_COMMAND_STEPS = text(
    f"""
    SELECT a.action_id
    FROM action_execution a
    JOIN machine_command c ON c.external_key = a.external_key AND c.org_id = :org_id
    WHERE a.execution_id = :execution_id AND a.status = '{CheckpointStatus.SUCCEEDED}'
      AND a.capability = 'machine.command'
      AND c.status IN ('{CommandStatus.CANCELLED}', '{CommandStatus.EXPIRED}')
      AND c.sent_at IS NULL
    FOR UPDATE OF c
    """
)


def untaken_command_steps(
    conn: Connection, *, org_id: str, execution_id: uuid.UUID
) -> frozenset[str]:
    """The execution's succeeded machine.command steps whose command no agent ever took
    and none ever will; run in the cancel's transaction, after cancel_for_execution."""
    rows = conn.execute(
        _UNTAKEN_COMMAND_STEPS, {"org_id": org_id, "execution_id": execution_id}
    ).all()
    return frozenset(row.action_id for row in rows)
