"""Commands that can no longer be delivered: a wait's read that expires or re-times its
command, and the maintenance pass's sweep of pending commands past their deliver-by time.

A command's deliver-by time is the deadline of the wait that waits for it, else
COMMAND_DELIVERY_SECONDS after it was written. The claim (machines/commands.py) never
hands one out past it; here a command nobody took by then becomes `expired`, a final
status ("never delivered"), and the executions waiting on it are woken in the same
transaction, like any status change.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from orquestador.domain.statuses import CommandStatus
from orquestador.machines.commands import Command, command_of, wait_key
from orquestador.queue.waits import wake_waiting

# The command under the row lock (a poll that takes it at the same moment either took
# it first, and this finds it sent, or skips it), with the wait's deadline computed in
# the database's clock: from the step's first start, or, for a caller that passes
# none, from the command's writing.
_FOR_WAIT = text(
    """
    SELECT id, machine_id, command, args, status, exit_code, created_at, updated_at,
           deliver_by, clock_timestamp() AS now,
           coalesce(CAST(:first_started_at AS timestamptz), created_at)
               + make_interval(secs => :deadline_seconds) AS deadline
    FROM machine_command
    WHERE org_id = :org_id AND id = :id
    FOR UPDATE
    """
)

_EXPIRE = text(
    f"""
    UPDATE machine_command
    SET status = '{CommandStatus.EXPIRED}', finished_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE id = :id AND status = '{CommandStatus.PENDING}'
    """
)

# The wait's deadline becomes the command's deliver-by time. updated_at is left alone:
# it is not a status change, and a park compares it with its claim to tell one.
_RETIME = text(
    f"""
    UPDATE machine_command SET deliver_by = :deliver_by
    WHERE id = :id AND status = '{CommandStatus.PENDING}'
    """
)

_BY_ID = text(
    """
    SELECT id, machine_id, command, args, status, exit_code, created_at, updated_at,
           deliver_by, clock_timestamp() AS now
    FROM machine_command WHERE id = :id
    """
)


@dataclass(frozen=True)
class WaitRead:
    """What a wait's round read of its command, and its own deadline in database time."""

    command: Command
    deadline: datetime

    @property
    def deadline_passed(self) -> bool:
        return self.deadline <= self.command.read_at


def read_for_wait(
    conn: Connection,
    *,
    org_id: str,
    command_id: uuid.UUID,
    first_started_at: datetime | None,
    deadline_seconds: float,
) -> WaitRead | None:
    """The command as a wait's round sees it, in the caller's transaction; None if missing.

    A pending command whose deliver-by time or the wait's deadline has passed is expired
    here, so what the wait reports ("expired") is what every agent will find: the read
    and the expiry commit together. A pending command within both gets the wait's
    deadline as its deliver-by time (longer or shorter than the default), never one
    whose time already passed: an expired command is not revived.
    """
    row = conn.execute(
        _FOR_WAIT,
        {
            "org_id": org_id,
            "id": command_id,
            "first_started_at": first_started_at,
            "deadline_seconds": deadline_seconds,
        },
    ).one_or_none()
    if row is None:
        return None
    if row.status == CommandStatus.PENDING:
        if row.deliver_by <= row.now or row.deadline <= row.now:
            conn.execute(_EXPIRE, {"id": row.id})
            wake_waiting(conn, wait_key(row.id))
            return WaitRead(_read_again(conn, row.id), row.deadline)
        if row.deliver_by != row.deadline:
            conn.execute(_RETIME, {"id": row.id, "deliver_by": row.deadline})
            return WaitRead(_read_again(conn, row.id), row.deadline)
    return WaitRead(command_of(row), row.deadline)


def _read_again(conn: Connection, command_id: uuid.UUID) -> Command:
    return command_of(conn.execute(_BY_ID, {"id": command_id}).one())


# Oldest deliver-by first, in a bounded batch, through the partial index of pending
# commands; SKIP LOCKED leaves a row a poll or a wait holds to them.
_EXPIRE_UNDELIVERED = text(
    f"""
    UPDATE machine_command AS c
    SET status = '{CommandStatus.EXPIRED}', finished_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE c.id IN (
        SELECT id FROM machine_command
        WHERE status = '{CommandStatus.PENDING}' AND deliver_by <= clock_timestamp()
        ORDER BY deliver_by
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ) AND c.status = '{CommandStatus.PENDING}'
    RETURNING c.id
    """
)


def expire_undelivered(conn: Connection, batch: int) -> int:
    """Expire up to `batch` pending commands whose deliver-by time passed; how many.

    Their waits are woken in the same transaction. A command no wait waits for is shown
    `expired` from then on, rather than `pending` forever on a machine whose agent is gone.
    """
    if batch <= 0:
        raise ValueError("batch must be greater than zero")
    expired: list[Any] = list(conn.execute(_EXPIRE_UNDELIVERED, {"batch": batch}))
    for row in expired:
        wake_waiting(conn, wait_key(row.id))
    return len(expired)
