"""OpenAPI paths and schemas of the operators' machine routes (/machines/...)."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    json_response,
    problems,
    query_parameter,
    ref,
)
from orquestador.domain.statuses import CommandStatus, values

_READERS = (
    "Scope `requests:read-all` or `machines:admin`. Machines are the caller's "
    "organization's: a machine or command of another organization answers the same 404 as "
    "a missing one."
)


def _path_parameter(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


_MACHINE_ID = _path_parameter("machineId", {"type": "string", "minLength": 1, "maxLength": 200})
_COMMAND_ID = _path_parameter("commandId", {"type": "string", "format": "uuid"})

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
_TIME = {"type": "string", "format": "date-time"}
_MAYBE_TIME = {"type": ["string", "null"], "format": "date-time"}

SCHEMAS: dict[str, Any] = {
    "MachineAgent": {
        "type": "object",
        "required": ["status", "lastSeenAt", "secondsSinceSeen", "words"],
        "additionalProperties": False,
        "description": "The machine's agent as read now: worked out from when its polls "
        "and reports last showed it (written at most once per machine per 10 seconds), "
        "never flipped by a job.",
        "properties": {
            "status": {
                "enum": ["online", "offline", "never seen"],
                "description": "`offline`: not seen for more than `AGENT_OFFLINE_SECONDS` "
                "(default 90).",
            },
            "lastSeenAt": _MAYBE_TIME,
            "secondsSinceSeen": {"type": ["integer", "null"], "minimum": 0},
            "words": {
                "type": "string",
                "description": "As the pages say it: `agent last seen 12 s ago`, "
                "`offline: agent last seen 3 min ago` or `no agent seen yet`.",
            },
        },
    },
    "Machine": {
        "type": "object",
        "required": ["id", "agent", "lastCommandAt", "commandsUnderWay", "validCredentials"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "agent": ref("MachineAgent"),
            "lastCommandAt": _MAYBE_TIME,
            "commandsUnderWay": {
                "type": "integer",
                "minimum": 0,
                "description": "Commands pending, sent or running.",
            },
            "validCredentials": {
                "type": "integer",
                "minimum": 0,
                "description": "Enrolled agent credentials neither revoked nor expired.",
            },
        },
    },
    "MachineList": {
        "type": "object",
        "required": ["items", "next"],
        "additionalProperties": False,
        "properties": {
            "items": {"type": "array", "items": ref("Machine")},
            "next": {
                "type": ["string", "null"],
                "description": "Pass as `after` for the next page; null on the last.",
            },
        },
    },
    "MachineCommand": {
        "type": "object",
        "required": [
            "id",
            "command",
            "args",
            "status",
            "exitCode",
            "createdAt",
            "sentAt",
            "finishedAt",
            "deliverBy",
            "stopRequestedAt",
            "outputBytes",
            "outputTruncated",
            "executionId",
            "actionId",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "command": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
            "status": {"enum": list(values(CommandStatus))},
            "exitCode": {"type": ["integer", "null"]},
            "createdAt": _TIME,
            "sentAt": _MAYBE_TIME,
            "finishedAt": _MAYBE_TIME,
            "deliverBy": {
                **_TIME,
                "description": "No agent is handed the command after it: still pending "
                "then, it ends `expired`.",
            },
            "stopRequestedAt": _MAYBE_TIME,
            "outputBytes": {"type": "integer", "minimum": 0},
            "outputTruncated": {"type": "boolean"},
            "executionId": {"type": "string", "description": "The execution that sent it."},
            "actionId": {"type": "string", "description": "Its step in that execution."},
        },
    },
    "MachineCommandList": {
        "type": "object",
        "required": ["machineId", "items"],
        "additionalProperties": False,
        "properties": {
            "machineId": {"type": "string"},
            "items": {"type": "array", "items": ref("MachineCommand")},
        },
    },
    "CommandOutput": {
        "type": "object",
        "required": ["output", "nextOffset", "complete", "truncated"],
        "additionalProperties": False,
        "properties": {
            "output": {
                "type": "string",
                "description": "What was kept of the output past `after`: the head and the "
                "latest bytes, within `COMMAND_OUTPUT_MAX_BYTES`, configured secrets "
                "redacted; where bytes were dropped between the two, a line "
                "`[… N bytes of output dropped …]` says so.",
            },
            "nextOffset": {
                "type": "integer",
                "minimum": 0,
                "description": "Where to ask from next time (`after`) for what comes next.",
            },
            "complete": {
                "type": "boolean",
                "description": "true once the command's status is final: no more output will come.",
            },
            "truncated": {
                "type": "boolean",
                "description": "true when part of the output was dropped to stay within "
                "`COMMAND_OUTPUT_MAX_BYTES`.",
            },
        },
    },
    "MachineCredential": {
        "type": "object",
        "required": ["id", "issuedAt", "expiresAt", "revokedAt"],
        "properties": {
            "id": {
                "type": "string",
                "description": "The credential's id: the `jti` of the agent token "
                "`orquestador machines enroll` issued.",
            },
            "issuedAt": {"type": "string", "format": "date-time"},
            "expiresAt": {"type": "string", "format": "date-time"},
            "revokedAt": {"type": ["string", "null"], "format": "date-time"},
        },
    },
    "MachineCredentialsRevoked": {
        "type": "object",
        "required": ["machineId", "revoked"],
        "properties": {
            "machineId": {"type": "string"},
            "revoked": {
                "type": "array",
                "items": ref("MachineCredential"),
                "description": "The credentials this call revoked; empty when every one "
                "was already revoked.",
            },
        },
    },
}


_LIMIT = query_parameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
    "How many at most (1 to 200).",
)


def paths() -> dict[str, Any]:
    return {
        "/machines": {
            "get": {
                "operationId": "listMachines",
                "summary": "List the organization's machines and their agents' liveness",
                "description": _READERS
                + " A machine is any id the organization's records name: an agent that "
                "polled, an enrolled credential, a command sent to it. By id.",
                "security": SECURED,
                "parameters": [
                    _LIMIT,
                    query_parameter("after", {"type": "string"}, "The `next` of the page before."),
                ],
                "responses": {
                    "200": json_response(ref("MachineList"), "A page of machines."),
                    **problems(
                        "400",
                        "401",
                        "403",
                        "414",
                        "431",
                        "503",
                        s403="The token holds neither `requests:read-all` nor `machines:admin`.",
                    ),
                },
            }
        },
        "/machines/{machineId}": {
            "get": {
                "operationId": "getMachine",
                "summary": "Read a machine: its agent's liveness and its commands under way",
                "description": _READERS,
                "security": SECURED,
                "parameters": [_MACHINE_ID],
                "responses": {
                    "200": json_response(ref("Machine"), "The machine."),
                    **problems(
                        *READ_ERRORS,
                        "503",
                        s403="The token holds neither `requests:read-all` nor `machines:admin`.",
                        s404="Nothing of the caller's organization names this machine.",
                    ),
                },
            }
        },
        "/machines/{machineId}/commands": {
            "get": {
                "operationId": "listMachineCommands",
                "summary": "List a machine's recent commands",
                "description": _READERS + " Newest first: status, times, deliver-by "
                "time, exit code, output size, and the execution and step that sent each.",
                "security": SECURED,
                "parameters": [_MACHINE_ID, _LIMIT],
                "responses": {
                    "200": json_response(ref("MachineCommandList"), "The newest commands."),
                    **problems(
                        "400",
                        *READ_ERRORS,
                        "503",
                        s403="The token holds neither `requests:read-all` nor `machines:admin`.",
                        s404="Nothing of the caller's organization names this machine.",
                    ),
                },
            }
        },
        "/machines/{machineId}/commands/{commandId}/output": {
            "get": {
                "operationId": "getCommandOutput",
                "summary": "Read a command's output, live",
                "description": _READERS
                + " The agent sends a running command's output in chunks; this reads what "
                "was kept past byte `after` (0: from the start). Ask again with "
                "`nextOffset` while `complete` is false to follow it as it runs.",
                "security": SECURED,
                "parameters": [
                    _MACHINE_ID,
                    _COMMAND_ID,
                    query_parameter(
                        "after",
                        {"type": "integer", "minimum": 0, "default": 0},
                        "A byte offset in what was kept: the output past it is answered.",
                    ),
                ],
                "responses": {
                    "200": json_response(ref("CommandOutput"), "The output past `after`."),
                    **problems(
                        "400",
                        *READ_ERRORS,
                        "503",
                        s403="The token holds neither `requests:read-all` nor `machines:admin`.",
                        s404="No such command of this machine in the caller's organization.",
                    ),
                },
            }
        },
        "/machines/{machineId}/credentials": {
            "delete": {
                "operationId": "revokeMachineCredentials",
                "summary": "Revoke a machine agent's enrolled credentials",
                "description": "Scope `machines:admin`. Revokes every credential of the "
                "machine in the caller's organization that is still valid (enrolled with "
                "`orquestador machines enroll`): the API refuses their tokens 401 from the "
                "next request on. Repeating it changes nothing and answers 200 with an "
                "empty `revoked`. Each revocation is audited (`MACHINE_CREDENTIALS_REVOKED`, "
                "with the caller as actor). A machine never enrolled in the organization, "
                "or only in another one, answers the same 404.",
                "security": SECURED,
                "parameters": [
                    {
                        "name": "machineId",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    }
                ],
                "responses": {
                    "200": json_response(
                        ref("MachineCredentialsRevoked"), "The credentials revoked now."
                    ),
                    **problems(
                        *READ_ERRORS,
                        "503",
                        s403="The token lacks the `machines:admin` scope.",
                        s404="The machine has no enrolled credential in the caller's "
                        "organization (the same answer for another organization's machine).",
                    ),
                },
            }
        },
    }
