"""The OpenAPI part of an organization's quotas."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import READ_ERRORS, SECURED, json_response, problems, ref

_QUOTA = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer", "minimum": 0},
        "used": {"type": "integer", "minimum": 0, "description": "In use now, where counted."},
    },
    "required": ["limit"],
}

SCHEMAS: dict[str, Any] = {
    "Quotas": {
        "type": "object",
        "properties": {
            "org": {"type": "string"},
            "quotas": {
                "type": "object",
                "description": "Each quota by its name (the names ORG_QUOTAS takes): "
                "`schedules` (used: schedules held), `scheduleMinSeconds`, "
                "`transitionsPerSecond`, `transitionsBurst` (used: tokens taken from the "
                "bucket and not yet refilled), `openExecutions` (used: executions not "
                "ended, parked ones too; a little over the limit when acceptances at the "
                "same moment took the last places), `bulkItems`, `rolloutItems`.",
                "additionalProperties": _QUOTA,
            },
        },
        "required": ["org", "quotas"],
    }
}


def paths() -> dict[str, Any]:
    return {
        "/orgs/{org}/quotas": {
            "get": {
                "operationId": "readQuotas",
                "summary": "The organization's quotas: each limit and what is in use",
                "description": "Scope `org:admin` or `plans:admin`, own organization only. "
                "Limits come from the QUOTA_* settings and ORG_QUOTAS.",
                "security": SECURED,
                "parameters": [
                    {
                        "name": "org",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                        "description": "The caller's own organization; any other is 404.",
                    }
                ],
                "responses": {
                    "200": json_response(ref("Quotas"), "The quotas."),
                    **problems(
                        *READ_ERRORS,
                        s404="Not the caller's organization (the same answer as an unknown path).",
                    ),
                },
            },
        },
    }
