"""machine.command@1 and machine.wait@1: send a command to a machine's agent, wait for it.

machine.command writes one row per external key (a retry finds the first call's row);
machine.wait reads the row and, while it is not final and the step's own deadline has
not passed, raises NotReady so the engine parks the execution instead of holding a
thread. The deadline is measured in database time from the step's first start, and is
the command's deliver-by time: a command still pending when it passes expires in the
transaction of the read that sees it pass, so no agent ever gets it afterwards.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from orquestador.actions.builtin.database import BuiltinDatabase, builtin_timeout_seconds
from orquestador.actions.contracts import ActionContext, Adapter, Effect
from orquestador.actions.errors import NotReady, PermanentError
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings
from orquestador.db.schema import COMMAND_STATUSES, FINAL_COMMAND_STATUSES
from orquestador.domain.statuses import CommandStatus
from orquestador.machines.commands import (
    DEFAULT_DELIVERY_SECONDS,
    Command,
    create_command,
    wait_key,
)
from orquestador.machines.expiry import read_for_wait

COMMAND_NOT_ALLOWED = "COMMAND_NOT_ALLOWED"
COMMAND_NOT_FOUND = "COMMAND_NOT_FOUND"
COMMAND_CANCELLED = "COMMAND_CANCELLED"
COMMAND_EXPIRED = "COMMAND_EXPIRED"
WAIT_DEADLINE_EXCEEDED = "WAIT_DEADLINE_EXCEEDED"
# Final statuses that are no answer a flow can go on from: the wait fails instead.
NO_ANSWER = (CommandStatus.CANCELLED, CommandStatus.EXPIRED)

# An agent's token names its machine in `sub` ("machine:<id>", at most 200 characters).
MAX_MACHINE_ID_CHARACTERS = 192
MAX_ARGS = 32
MAX_ARG_CHARACTERS = 1024
MAX_DEADLINE_SECONDS = 86400
# A parked wait looks again at least this often even if no wake arrives (a lost
# notification, a status changed by hand): the wake is the fast path, this the bound.
POLL_FALLBACK_SECONDS = 30.0
# The first round looks again this soon. A status change wakes a parked execution by its
# wait key; a change landing between the first round's read and its park (before the key
# is on the row) is caught by the park itself, which looks at the command. Every round is
# woken at once by a change; this interval, growing with the time waited, is the backstop.
FIRST_RECHECK_SECONDS = 1.0

COMMAND_INPUT: dict[str, Any] = {
    "type": "object",
    "required": ["machineId", "command"],
    "additionalProperties": False,
    "properties": {
        "machineId": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_MACHINE_ID_CHARACTERS,
            "pattern": r"^[^\s]+$",
        },
        "command": {"type": "string", "minLength": 1, "maxLength": 100},
        "args": {
            "type": "array",
            "maxItems": MAX_ARGS,
            "items": {"type": "string", "maxLength": MAX_ARG_CHARACTERS},
        },
    },
}
COMMAND_OUTPUT: dict[str, Any] = {
    "type": "object",
    "required": ["commandId", "status"],
    "properties": {
        "commandId": {"type": "string", "format": "uuid"},
        "status": {"enum": list(COMMAND_STATUSES)},
    },
}
WAIT_INPUT: dict[str, Any] = {
    "type": "object",
    "required": ["commandId", "deadlineSeconds"],
    "additionalProperties": False,
    "properties": {
        "commandId": {"type": "string", "minLength": 1, "maxLength": 100},
        "deadlineSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS},
    },
}
WAIT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "required": ["commandId", "status", "exitCode"],
    "properties": {
        "commandId": {"type": "string", "format": "uuid"},
        # A cancelled or expired command is no answer a flow can go on from: the wait
        # fails instead.
        "status": {"enum": [s for s in FINAL_COMMAND_STATUSES if s not in NO_ANSWER]},
        "exitCode": {"type": ["integer", "null"]},
    },
}


class MachineAdapters:
    """The two machine adapters, bound to the allow-list and the built-ins' database."""

    def __init__(
        self,
        allowed: list[str],
        database: BuiltinDatabase,
        *,
        delivery_seconds: float = DEFAULT_DELIVERY_SECONDS,
    ) -> None:
        self._allowed = frozenset(allowed)
        self._database = database
        self._delivery_seconds = delivery_seconds

    # --- machine.command ---------------------------------------------------------------

    def _checked_command(self, ctx: ActionContext) -> str:
        command = ctx.inputs["command"]
        if command not in self._allowed:
            raise PermanentError(
                COMMAND_NOT_ALLOWED,
                f"command {command!r} is not in MACHINE_COMMANDS "
                f"({', '.join(sorted(self._allowed)) or 'empty'})",
            )
        return command

    def send(self, ctx: ActionContext) -> dict[str, Any]:
        command = self._checked_command(ctx)
        # Past the deadline another holder may own the step: nothing is written late.
        ctx.check_deadline("the command")
        with self._database.engine.begin() as conn:
            row = create_command(
                conn,
                org_id=ctx.identity.org_id,
                machine_id=ctx.inputs["machineId"],
                command=command,
                args=list(ctx.inputs.get("args", [])),
                external_key=ctx.external_key,
                delivery_seconds=self._delivery_seconds,
            )
        return {"commandId": str(row.id), "status": row.status}

    def simulate_send(self, ctx: ActionContext) -> dict[str, Any]:
        command = self._checked_command(ctx)
        machine, args = ctx.inputs["machineId"], list(ctx.inputs.get("args", []))
        ctx.observe(
            {
                "summary": f"would send {command} to machine {machine}",
                "machineId": machine,
                "command": command,
                "args": args,
            }
        )
        # A stable, recognisable id derived from the key: nothing is written anywhere.
        return {
            "commandId": str(uuid.uuid5(uuid.NAMESPACE_URL, ctx.external_key)),
            "status": CommandStatus.PENDING.value,
        }

    # --- machine.wait ------------------------------------------------------------------

    def wait(self, ctx: ActionContext) -> dict[str, Any]:
        command_id = ctx.inputs["commandId"]
        try:
            parsed = uuid.UUID(command_id)
        except ValueError:
            raise PermanentError(COMMAND_NOT_FOUND, "no such command") from None
        with self._database.engine.begin() as conn:
            # The id comes from JSON the flow produced: the organization bounds the read.
            # A pending command past the deadline expires in this same transaction.
            read = read_for_wait(
                conn,
                org_id=ctx.identity.org_id,
                command_id=parsed,
                first_started_at=ctx.first_started_at,
                deadline_seconds=ctx.inputs["deadlineSeconds"],
            )
        if read is None:
            raise PermanentError(COMMAND_NOT_FOUND, "no such command in this organization")
        command = read.command
        seen = _seen(command)
        if command.status == CommandStatus.CANCELLED:
            # Never an output: a flow reading `status` must not take a stopped command
            # (perhaps half done on the machine) for one that ran to its end.
            raise PermanentError(
                COMMAND_CANCELLED,
                "the command was cancelled before it finished: the machine may have done "
                "part of it",
                observed=seen,
            )
        if command.status == CommandStatus.EXPIRED and not read.deadline_passed:
            raise PermanentError(
                COMMAND_EXPIRED,
                "the command was never delivered: its deliver-by time passed before any "
                "agent took it",
                observed=seen,
            )
        if command.final and command.status != CommandStatus.EXPIRED:
            ctx.observe(seen)
            return {
                "commandId": str(command.id),
                "status": command.status,
                "exitCode": command.exit_code,
            }
        left = read.deadline - command.read_at
        if left > timedelta(0):
            waited = (command.read_at - _started(ctx, command)).total_seconds()
            interval = min(POLL_FALLBACK_SECONDS, max(FIRST_RECHECK_SECONDS, waited))
            raise NotReady(
                min(max(left.total_seconds(), 0.001), interval),
                wait_key=wait_key(command.id),
                observed=seen,
            )
        # A command an agent took goes on: a deadline ends the wait, never a command that
        # may be running. One nobody took expired with this read: it will never run.
        raise PermanentError(
            WAIT_DEADLINE_EXCEEDED,
            "the command was never delivered: no agent took it before the wait's deadline"
            if command.status == CommandStatus.EXPIRED
            else f"the command was still {command.status} when the wait's deadline passed",
            observed=seen,
        )

    def simulate_wait(self, ctx: ActionContext) -> dict[str, Any]:
        return {
            "commandId": ctx.inputs["commandId"],
            "status": CommandStatus.SUCCEEDED.value,
            "exitCode": 0,
        }


def _seen(command: Command) -> dict[str, Any]:
    seen_at = command.read_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return {"commandId": str(command.id), "status": command.status, "seenAt": seen_at}


def _started(ctx: ActionContext, command: Command) -> datetime:
    # Without a recorded first start (a caller that does not pass one) the wait counts
    # from the command's creation, just before the wait began: its deadline still ends it.
    return ctx.first_started_at or command.created_at


def register(registry: AdapterRegistry, settings: Settings, database: BuiltinDatabase) -> None:
    adapters = MachineAdapters(
        settings.machine_command_list,
        database,
        delivery_seconds=settings.command_delivery_seconds,
    )
    registry.add(
        Adapter(
            capability="machine.command",
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema=COMMAND_INPUT,
            output_schema=COMMAND_OUTPUT,
            timeout_seconds=builtin_timeout_seconds(settings.worker_lease_seconds),
            max_attempts=3,
            invoke=adapters.send,
            simulate=adapters.simulate_send,
        )
    )
    registry.add(
        Adapter(
            capability="machine.wait",
            version=1,
            effect=Effect.READ_ONLY,
            input_schema=WAIT_INPUT,
            output_schema=WAIT_OUTPUT,
            timeout_seconds=builtin_timeout_seconds(settings.worker_lease_seconds),
            max_attempts=3,
            invoke=adapters.wait,
            # It reads only this product's database, yet a dry run simulates it rather than
            # calling it: the command it would read is the simulated one, which exists nowhere.
            simulate=adapters.simulate_wait,
        )
    )
