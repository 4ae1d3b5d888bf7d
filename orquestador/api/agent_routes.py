"""The machine agent API: an agent long-polls its own machine's commands and reports status.

An agent's token has the `agent` scope and `sub` = "machine:<machineId>"; its `org` is
the machine's organization. Every look-up carries both in its WHERE: another machine's
or another organization's command answers the same 404 as a missing one.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request

from orquestador.api.auth import SCOPE_AGENT, Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.context import engine
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.domain.errors import Problem
from orquestador.machines import (
    MAX_OUTPUT_CHARACTERS,
    CommandNotFound,
    StatusConflict,
    next_command,
    report_status,
)
from orquestador.machines.bell import bell_for
from orquestador.machines.commands import REPORTABLE
from orquestador.machines.long_poll import MAX_WAIT_SECONDS

blueprint = Blueprint("agent", __name__, url_prefix=f"{API_PREFIX}/agent")

MACHINE_SUBJECT_PREFIX = "machine:"

STATUS_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["status"],
    "additionalProperties": False,
    "properties": {
        "status": {"enum": list(REPORTABLE)},
        "exitCode": {"type": ["integer", "null"], "minimum": -(2**31), "maximum": 2**31 - 1},
        # Longer output is accepted and cut to MAX_OUTPUT_CHARACTERS when stored.
        "output": {"type": ["string", "null"]},
    },
}


def _machine_of(caller: Caller) -> str:
    machine = caller.sub.removeprefix(MACHINE_SUBJECT_PREFIX)
    if not caller.sub.startswith(MACHINE_SUBJECT_PREFIX) or not machine:
        raise ApiProblem(
            403,
            "NOT_A_MACHINE",
            "An agent token's subject must be machine:<machineId> "
            "(orquestador token --machine M --org O).",
        )
    return machine


def _wait_seconds() -> float:
    raw = request.args.get("wait", "0")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (0 <= seconds <= MAX_WAIT_SECONDS):  # NaN fails both comparisons
        raise ApiProblem(
            400,
            "QUERY_INVALID",
            "A query parameter is invalid.",
            problems=[Problem("/wait", f"seconds from 0 to {MAX_WAIT_SECONDS:g}")],
        )
    return seconds


@blueprint.post("/commands/next")
@requires_scope(SCOPE_AGENT)
def take_next() -> Response | tuple[str, int]:
    caller = current_caller()
    machine = _machine_of(caller)
    wait = _wait_seconds()
    database = engine()
    # The bell listens on a connection of its own (psycopg's URL, without the driver name).
    conninfo = database.url.set(drivername="postgresql").render_as_string(hide_password=False)
    command = next_command(
        database,
        org_id=caller.org,
        machine_id=machine,
        wait_seconds=wait,
        bell=bell_for(conninfo),
    )
    if command is None:
        return "", 204
    return jsonify(command.as_json())


@blueprint.post("/commands/<command_id>/status")
@requires_scope(SCOPE_AGENT)
def report(command_id: str) -> Response:
    caller = current_caller()
    machine = _machine_of(caller)
    try:
        parsed = uuid.UUID(command_id)
    except ValueError:
        raise not_found() from None
    body = read_json_object(STATUS_BODY)
    output = body.get("output")
    try:
        with engine().begin() as conn:
            reported = report_status(
                conn,
                org_id=caller.org,
                machine_id=machine,
                command_id=parsed,
                status=body["status"],
                exit_code=body.get("exitCode"),
                output=output,
            )
    except CommandNotFound:
        raise not_found() from None
    except StatusConflict as conflict:
        raise ApiProblem(
            409,
            "STATUS_CONFLICT",
            f"The command is {conflict.current}; statuses only move forward "
            "(pending, sent, running, then one final status).",
        ) from None
    return jsonify(
        {
            "id": str(reported.id),
            "status": reported.status,
            "exitCode": reported.exit_code,
            "updatedAt": timestamp(reported.updated_at),
            "finishedAt": timestamp(reported.finished_at),
            "changed": reported.changed,
            "outputTruncated": output is not None and len(output) > MAX_OUTPUT_CHARACTERS,
        }
    )
