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
SCHEMAS: dict[str, Any] = {
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


def paths() -> dict[str, Any]:
    return {
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
