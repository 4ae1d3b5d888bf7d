"""OpenAPI paths and schemas of the machine agent API (/agent/...)."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    json_response,
    problems,
    query_parameter,
    ref,
)
from orquestador.db.schema import COMMAND_STATUSES
from orquestador.machines.commands import REPORTABLE

_AGENT = (
    "Scope `agent`; the token's `sub` is `machine:<machineId>` and its `org` the machine's "
    "organization (`orquestador token --machine M --org O`). An agent sees only its own "
    "machine's commands in its own organization; any other command answers 404, the same "
    "as a missing one. A token with the scope but another kind of subject is refused 403 "
    "`NOT_A_MACHINE`."
)

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
    "AgentCommand": {
        "type": "object",
        "required": ["id", "command", "args"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "command": {
                "type": "string",
                "description": "A name from the server's MACHINE_COMMANDS; the agent maps "
                "it to an argv of its own AGENT_COMMANDS_FILE.",
            },
            "args": {"type": "array", "items": {"type": "string"}},
            "deliverBy": {
                "type": "string",
                "format": "date-time",
                "description": "The command's deliver-by time: no agent may start it later "
                "(the server hands it out only before it).",
            },
            "deliverWithinSeconds": {
                "type": "number",
                "description": "How long before `deliverBy` the server handed it out. The "
                "reference agent counts it down on its own monotonic clock from the answer's "
                "arrival, so clocks need not agree, and reports `expired` instead of starting "
                "a command whose time ran out.",
            },
        },
    },
    "AgentStopRequest": {
        "type": "object",
        "required": ["id", "cancelRequested"],
        "additionalProperties": False,
        "description": "A command this machine's agent took before (sent or running) whose "
        "execution was cancelled: stop it if it runs, then report `cancelled` (or the final "
        "status it reached). Polls answer it, before any new command, until a final status "
        "is reported. No command name or args: nothing here is to be run.",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "cancelRequested": {"const": True},
        },
    },
    "CommandStatusReport": {
        "type": "object",
        "required": ["status"],
        "additionalProperties": False,
        "properties": {
            "status": {
                "enum": list(REPORTABLE),
                "description": "`expired`: the agent did not start the command because its "
                "deliver-by time had passed by the time it would have.",
            },
            "exitCode": {"type": ["integer", "null"], "format": "int32"},
            "output": {
                "type": ["string", "null"],
                "description": "A chunk of the command's output (the reference agent sends "
                "at most 64 KiB, at most every 2 seconds, while the command runs, and the "
                "rest with the final status). Taken once by its offset; the server keeps at "
                "most `COMMAND_OUTPUT_MAX_BYTES` of it, the first half and the latest half, "
                "configured secrets redacted.",
            },
            "outputOffset": {
                "type": "integer",
                "minimum": 0,
                "description": "Bytes (UTF-8) of output the agent sent before this chunk "
                "(default 0). A chunk sent again is taken once; one starting further on "
                "says the bytes in between were skipped (they count as dropped).",
            },
        },
    },
    "CommandStatus": {
        "type": "object",
        "required": [
            "id",
            "status",
            "exitCode",
            "updatedAt",
            "finishedAt",
            "changed",
            "cancelRequested",
        ],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {"enum": list(COMMAND_STATUSES)},
            "exitCode": {"type": ["integer", "null"]},
            "updatedAt": {"type": "string", "format": "date-time"},
            "finishedAt": {"type": ["string", "null"], "format": "date-time"},
            "changed": {
                "type": "boolean",
                "description": "false when the command already had this status (a repeated "
                "report changes nothing).",
            },
            "outputOffset": {
                "type": "integer",
                "description": "How much of the agent's output the server has taken: the "
                "offset of its next chunk.",
            },
            "outputTruncated": {
                "type": "boolean",
                "description": "true once part of the output was dropped to stay within "
                "`COMMAND_OUTPUT_MAX_BYTES` (what is kept is its head and its tail).",
            },
            "cancelRequested": {
                "type": "boolean",
                "description": "true when a cancel of the command's execution asked the "
                "agent to stop it: stop the process and report `cancelled`.",
            },
        },
    },
}


def paths() -> dict[str, Any]:
    return {
        "/agent/commands/next": {
            "post": {
                "operationId": "takeNextCommand",
                "summary": "Take the machine's next command (long poll)",
                "description": _AGENT
                + " Hands out the machine's oldest `pending` command and marks it `sent`: "
                "each command is handed out once, to one agent, even when several poll at "
                "once, and never past its `deliverBy` (such a command ends `expired`, never "
                "delivered). A command the agent took before and a cancel asked to stop comes "
                "first, as `{id, cancelRequested: true}`, until the agent reports a final "
                "status for it. With none pending, waits up to `wait` seconds for one, then "
                "answers 204. No body.\n\nA poll that waits holds one of the API process's request "
                "threads, so polls may hold at most `AGENT_POLL_SHARE` of them; beyond it a "
                "poll answers 429 at once, with `Retry-After`. A machine has one open poll: "
                "a newer one ends the older with 204 at once. A poll with `wait` 0 only "
                "looks, and is never refused for the share.",
                "security": SECURED,
                "parameters": [
                    query_parameter(
                        "wait",
                        {"type": "number", "minimum": 0, "maximum": 30, "default": 0},
                        "Seconds to wait for a command when none is pending (0 to 30).",
                    )
                ],
                "responses": {
                    "200": json_response(
                        {"oneOf": [ref("AgentCommand"), ref("AgentStopRequest")]},
                        "A command, now `sent`; or a command to stop.",
                    ),
                    "204": {
                        "description": "No command arrived within `wait` seconds, or a newer "
                        "poll of the machine (or the server stopping) ended this one."
                    },
                    "429": {
                        "description": "`AGENT_POLLS_BUSY`: this API process already holds "
                        "all the long polls its share of request threads allows. Poll again "
                        "after `Retry-After` seconds, with jitter.",
                        "headers": {
                            "Retry-After": {
                                "description": "Seconds to wait before polling again.",
                                "schema": {"type": "integer", "minimum": 1},
                            }
                        },
                        "content": {"application/problem+json": {"schema": ref("Problem")}},
                    },
                    **problems(
                        "400",
                        *READ_ERRORS,
                        s400="`QUERY_INVALID`: `wait` is not a number from 0 to 30.",
                        s403="The token lacks the `agent` scope (`INSUFFICIENT_SCOPE`) or its "
                        "subject is not `machine:<machineId>` (`NOT_A_MACHINE`).",
                    ),
                },
            }
        },
        "/agent/commands/{commandId}/status": {
            "post": {
                "operationId": "reportCommandStatus",
                "summary": "Report a command's status",
                "description": _AGENT
                + " Statuses only move forward: `sent` → `running` → one final status "
                "(`succeeded`, `failed`, `timed_out`, `cancelled`); a final status may follow "
                "`sent` directly. The answer's `cancelRequested` tells the agent that a "
                "cancel asked it to stop the command; an agent running a command repeats "
                "`running` now and then to hear it. The same status again answers 200 and "
                "changes nothing (an agent may repeat a report whose answer it lost); a "
                "different final status, or any move backwards, is 409. Each change wakes "
                "the executions waiting on the command at once.",
                "security": SECURED,
                "parameters": [
                    {
                        "name": "commandId",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "format": "uuid"},
                    }
                ],
                "requestBody": body(ref("CommandStatusReport")),
                "responses": {
                    "200": json_response(ref("CommandStatus"), "The command's status now."),
                    **problems(
                        *WRITE_ERRORS,
                        "404",
                        "409",
                        s403="The token lacks the `agent` scope (`INSUFFICIENT_SCOPE`) or its "
                        "subject is not `machine:<machineId>` (`NOT_A_MACHINE`).",
                        s409="`STATUS_CONFLICT`: the status would move backwards, replace a "
                        "different final status, or the command was never sent.",
                    ),
                },
            }
        },
    }
