"""The command store: create by external key, claim for an agent, move statuses forward.

Every look-up carries the organization in its WHERE (a command id may come from JSON a
flow produced), and an agent's look-ups carry its machine as well: a foreign command is
indistinguishable from a missing one. Every status change wakes the executions waiting
on the command in the same transaction, so the wake commits with the change.

A command is handed to an agent only before its deliver-by time (SPEC 23); what happens
to one whose time passed is machines/expiry.py's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from orquestador.db.schema import COMMAND_STATUSES, FINAL_COMMAND_STATUSES
from orquestador.domain.statuses import CommandStatus
from orquestador.errors import Refusal
from orquestador.machines.bell import NEW_COMMAND_CHANNEL, notification_payload
from orquestador.machines.output import StoredOutput, append_chunk
from orquestador.queue.waits import COMMAND_WAIT_PREFIX, wake_waiting

FINAL = frozenset(FINAL_COMMAND_STATUSES)
# What an agent may report; pending and sent belong to the server. An agent reports
# `expired` for a command it refused to start because its deliver-by time had passed.
REPORTABLE = (CommandStatus.RUNNING.value, *FINAL_COMMAND_STATUSES)
# Forward only: a status may replace one of a lower rank, never the other way round.
_RANK = {
    CommandStatus.PENDING: 0,
    CommandStatus.SENT: 1,
    CommandStatus.RUNNING: 2,
    **{status: 3 for status in FINAL},
}
assert set(_RANK) == set(COMMAND_STATUSES)

# COMMAND_DELIVERY_SECONDS's default: how long a command no wait waits for may wait for
# an agent to take it.
DEFAULT_DELIVERY_SECONDS = 900

# COMMAND_OUTPUT_MAX_BYTES's default: the most of a command's output kept, head and tail.
DEFAULT_OUTPUT_MAX_BYTES = 1048576


def wait_key(command_id: uuid.UUID | str) -> str:
    """What an execution waiting on the command waits for (execution.wait_key)."""
    return f"{COMMAND_WAIT_PREFIX}{command_id}"


@dataclass(frozen=True)
class Command:
    """A command as the flow sees it, with the database's clock at the time of reading."""

    id: uuid.UUID
    machine_id: str
    command: str
    args: list[str]
    status: str
    exit_code: int | None
    created_at: datetime
    updated_at: datetime
    read_at: datetime  # the database's clock when the row was read
    # No agent is handed the command after this instant.
    deliver_by: datetime

    @property
    def final(self) -> bool:
        return self.status in FINAL


@dataclass(frozen=True)
class AgentCommand:
    """What an agent receives: the command to run, never anything of the flow.

    With `cancel_requested`, a command the agent was handed before and must stop: the
    answer then carries no command name or args, so no agent can mistake it for one to run.
    """

    id: uuid.UUID
    command: str
    args: list[str]
    cancel_requested: bool = False
    # The command's deliver-by time, and how long before it the server handed it out:
    # the agent refuses to start it later than that, counted on its own monotonic clock
    # from the answer's arrival (so the two clocks need not agree).
    deliver_by: datetime | None = None
    deliver_within_seconds: float | None = None

    def as_json(self) -> dict[str, Any]:
        if self.cancel_requested:
            return {"id": str(self.id), "cancelRequested": True}
        answer: dict[str, Any] = {"id": str(self.id), "command": self.command, "args": self.args}
        if self.deliver_by is not None:
            answer["deliverBy"] = self.deliver_by.isoformat()
            answer["deliverWithinSeconds"] = self.deliver_within_seconds
        return answer


class CommandNotFound(Refusal):
    """No such command for this organization (and machine)."""

    code = Refusal.NOT_FOUND


class StatusConflict(Refusal):
    """The status would move backwards, or replace a different final status."""

    code = "STATUS_CONFLICT"

    def __init__(self, current: str, wanted: str) -> None:
        super().__init__(f"the command is {current}; it cannot become {wanted}")
        self.current = current
        self.wanted = wanted

    @property
    def detail(self) -> str:
        return (
            f"The command is {self.current}; statuses only move forward "
            "(pending, sent, running, then one final status)."
        )


_COLUMNS = (
    "id, machine_id, command, args, status, exit_code, created_at, updated_at, deliver_by,"
    " clock_timestamp() AS now"
)

# Its deliver-by time counts from its writing; the wait that waits for it moves it to
# its own deadline (machines/expiry.py).
_INSERT = text(
    """
    INSERT INTO machine_command (org_id, machine_id, command, args, external_key, deliver_by)
    VALUES (:org_id, :machine_id, :command, CAST(:args AS jsonb), :external_key,
            clock_timestamp() + make_interval(secs => :delivery_seconds))
    ON CONFLICT (external_key) DO NOTHING
    RETURNING id
    """
)
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")
# The organization bounds the read of an existing row: an external key is unique
# across organizations, and one organization never reads another's command.
_BY_KEY = text(
    f"SELECT {_COLUMNS} FROM machine_command WHERE org_id = :org_id AND external_key = :key"
)
_BY_ID = text(f"SELECT {_COLUMNS} FROM machine_command WHERE org_id = :org_id AND id = :id")


def command_of(row: Any) -> Command:
    """A command row (with its `now`) as the flow sees it."""
    return Command(
        id=row.id,
        machine_id=row.machine_id,
        command=row.command,
        args=list(row.args or []),
        status=row.status,
        exit_code=row.exit_code,
        created_at=row.created_at,
        updated_at=row.updated_at,
        read_at=row.now,
        deliver_by=row.deliver_by,
    )


def create_command(
    conn: Connection,
    *,
    org_id: str,
    machine_id: str,
    command: str,
    args: list[str],
    external_key: str,
    delivery_seconds: float = DEFAULT_DELIVERY_SECONDS,
) -> Command:
    """Insert the command keyed by `external_key`, or return the row a first call inserted.

    A retry of the same step (same external key) never makes a second command, whatever
    happened to the first call's answer. No agent is handed it after `delivery_seconds`
    from now, unless a wait moves that to its own deadline.
    """
    inserted = conn.execute(
        _INSERT,
        {
            "org_id": org_id,
            "machine_id": machine_id,
            "command": command,
            "args": json.dumps(args),
            "external_key": external_key,
            "delivery_seconds": delivery_seconds,
        },
    ).one_or_none()
    if inserted is not None:
        # Heard once the transaction commits: the machine's waiting long polls look again.
        conn.execute(
            _NOTIFY,
            {
                "channel": NEW_COMMAND_CHANNEL,
                "payload": notification_payload(org_id, machine_id),
            },
        )
    row = conn.execute(_BY_KEY, {"org_id": org_id, "key": external_key}).one_or_none()
    if row is None:
        # The key belongs to another organization's command: never show it.
        raise CommandNotFound(external_key)
    return command_of(row)


def find_command(conn: Connection, *, org_id: str, command_id: uuid.UUID) -> Command | None:
    """The command with this id in this organization, or None (missing and foreign alike)."""
    row = conn.execute(_BY_ID, {"org_id": org_id, "id": command_id}).one_or_none()
    return None if row is None else command_of(row)


# The oldest pending command of the machine, marked sent. SKIP LOCKED: two agents
# polling for the same machine at once never take the same command; the UPDATE
# re-checks the status in case the row changed between the two. One reading of the
# clock decides and is recorded: a command is handed out only while its deliver-by time
# is ahead of that instant, which becomes its sent_at (a command past it stays pending
# until a wait or the maintenance pass expires it).
# The poll's credential is checked here too, not only when the poll began: a poll open
# while its machine is revoked hands out nothing. FOR SHARE orders it against the
# revocation's UPDATE: a revocation that commits first is seen (the lock waits, then
# re-reads the row), and one that comes after waits for this command to be sent. A token
# nobody enrolled has no row and is checked by its lifetime alone, at authentication.
_CLAIM = text(
    f"""
    WITH moment AS (SELECT clock_timestamp() AS at),
    credential AS (
        SELECT org_id, machine_id, revoked_at FROM machine_credential
        WHERE id = CAST(:credential_id AS text)
        FOR SHARE
    ),
    next AS (
        SELECT c.id FROM machine_command c, moment
        WHERE c.org_id = :org_id AND c.machine_id = :machine_id
          AND c.status = '{CommandStatus.PENDING}'
          AND c.deliver_by > moment.at
          AND NOT EXISTS (
              SELECT 1 FROM credential
              WHERE revoked_at IS NOT NULL OR org_id <> :org_id OR machine_id <> :machine_id
          )
        ORDER BY c.created_at, c.id
        LIMIT 1
        FOR UPDATE OF c SKIP LOCKED
    )
    UPDATE machine_command AS c
    SET status = '{CommandStatus.SENT}', sent_at = moment.at, updated_at = moment.at
    FROM next, moment
    WHERE c.id = next.id AND c.status = '{CommandStatus.PENDING}'
    RETURNING c.id, c.command, c.args, c.deliver_by,
              extract(epoch FROM c.deliver_by - moment.at) AS within_seconds
    """
)


# A command the machine's agent took and a cancel asked it to stop: the poll says so
# before it hands out anything new, until the agent reports a final status.
_STOP_REQUESTED = text(
    f"""
    SELECT id, command FROM machine_command
    WHERE org_id = :org_id AND machine_id = :machine_id
      AND status IN ('{CommandStatus.SENT}', '{CommandStatus.RUNNING}')
      AND cancel_requested_at IS NOT NULL
    ORDER BY cancel_requested_at, id
    LIMIT 1
    """
)


def claim_next(
    conn: Connection, *, org_id: str, machine_id: str, credential_id: str | None = None
) -> AgentCommand | None:
    """The machine's oldest command to stop, or its oldest pending one marked sent; or None.

    `credential_id` is the polling token's `jti`: a revoked credential is handed nothing.
    """
    params = {"org_id": org_id, "machine_id": machine_id}
    stop = conn.execute(_STOP_REQUESTED, params).one_or_none()
    if stop is not None:
        return AgentCommand(id=stop.id, command=stop.command, args=[], cancel_requested=True)
    row = conn.execute(_CLAIM, {**params, "credential_id": credential_id}).one_or_none()
    if row is None:
        return None
    wake_waiting(conn, wait_key(row.id))
    return AgentCommand(
        id=row.id,
        command=row.command,
        args=list(row.args or []),
        deliver_by=row.deliver_by,
        deliver_within_seconds=float(row.within_seconds),
    )


_LOCK_FOR_AGENT = text(
    """
    SELECT id, status, exit_code, updated_at, finished_at, cancel_requested_at,
           output, output_tail, output_received, output_size
    FROM machine_command
    WHERE org_id = :org_id AND machine_id = :machine_id AND id = :id
    FOR UPDATE
    """
)
_RETURNING = (
    "RETURNING id, status, exit_code, updated_at, finished_at, cancel_requested_at,"
    " output, output_tail, output_received, output_size"
)
_SET_RUNNING = text(
    f"""
    UPDATE machine_command SET status = '{CommandStatus.RUNNING}', updated_at = clock_timestamp()
    WHERE id = :id
    {_RETURNING}
    """
)
_SET_FINAL = text(
    f"""
    UPDATE machine_command
    SET status = :status, exit_code = :exit_code,
        updated_at = clock_timestamp(), finished_at = clock_timestamp()
    WHERE id = :id
    {_RETURNING}
    """
)
# The output as kept after a chunk: the head, the tail and how far each count goes. Not a
# status change: updated_at stays (a park compares it with its claim to tell one).
_SET_OUTPUT = text(
    f"""
    UPDATE machine_command
    SET output = :head, output_tail = :tail, output_received = :received,
        output_size = :size
    WHERE id = :id
    {_RETURNING}
    """
)


def stored_output(row: Any) -> StoredOutput:
    """A command row's output as kept (head, tail, counts)."""
    head = row.output or ""
    if row.output_size == 0 and head:
        # Written whole by a release before output came in chunks (migration 0027).
        size = len(head.encode())
        return StoredOutput(head=head, received=size, size=size)
    return StoredOutput(
        head=head,
        tail=row.output_tail or "",
        received=row.output_received,
        size=row.output_size,
    )


@dataclass(frozen=True)
class Reported:
    """A command's status after a report, and whether the report changed it."""

    id: uuid.UUID
    status: str
    exit_code: int | None
    updated_at: datetime
    finished_at: datetime | None
    changed: bool
    # A cancel asked the agent to stop the command: it should, and report `cancelled`.
    cancel_requested: bool = False
    # How much of the agent's output was taken (the next chunk's offset), and whether
    # some of it was dropped to stay within COMMAND_OUTPUT_MAX_BYTES.
    output_received: int = 0
    output_truncated: bool = False

    @classmethod
    def of(cls, row: Any, changed: bool) -> Reported:
        output = stored_output(row)
        return cls(
            row.id,
            row.status,
            row.exit_code,
            row.updated_at,
            row.finished_at,
            changed,
            row.cancel_requested_at is not None,
            output.received,
            output.dropped > 0,
        )


def report_status(
    conn: Connection,
    *,
    org_id: str,
    machine_id: str,
    command_id: uuid.UUID,
    status: str,
    exit_code: int | None = None,
    output: str | None = None,
    output_offset: int = 0,
    output_max_bytes: int = DEFAULT_OUTPUT_MAX_BYTES,
) -> Reported:
    """Move the machine's command forward to `status`, waking whoever waits on it, and
    take the chunk of output the report carries (at `output_offset`, once).

    The same status again changes nothing and succeeds (an agent repeating a report whose
    answer it lost, or repeating `running` with more output); a lower rank, a different
    final status, or any report before the command was sent raises StatusConflict, and
    then its output is not taken either.
    """
    if status not in REPORTABLE:
        raise ValueError(f"an agent cannot report {status!r}")
    row = conn.execute(
        _LOCK_FOR_AGENT, {"org_id": org_id, "machine_id": machine_id, "id": command_id}
    ).one_or_none()
    if row is None:
        raise CommandNotFound(str(command_id))
    changed = row.status != status
    if changed and (row.status == CommandStatus.PENDING or _RANK[status] <= _RANK[row.status]):
        raise StatusConflict(row.status, status)
    if output:
        before = stored_output(row)
        after = append_chunk(before, offset=output_offset, chunk=output, max_bytes=output_max_bytes)
        if after != before:
            row = conn.execute(
                _SET_OUTPUT,
                {
                    "id": row.id,
                    "head": after.head,
                    "tail": after.tail or None,
                    "received": after.received,
                    "size": after.size,
                },
            ).one()
    if not changed:
        return Reported.of(row, False)
    if status == CommandStatus.RUNNING:
        updated = conn.execute(_SET_RUNNING, {"id": row.id}).one()
    else:
        updated = conn.execute(
            _SET_FINAL, {"id": row.id, "status": status, "exit_code": exit_code}
        ).one()
    wake_waiting(conn, wait_key(row.id))
    return Reported.of(updated, True)
