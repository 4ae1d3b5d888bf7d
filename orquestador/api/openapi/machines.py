"""OpenAPI paths and schemas of the operators' machine routes (/machines/...)."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import READ_ERRORS, SECURED, json_response, problems, ref

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
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
        }
    }
