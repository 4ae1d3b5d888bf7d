"""JSON Schemas of request and response bodies, shared by body checks and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from orquestador.db.schema import EXECUTION_STATUSES

_UUID = {"type": "string", "format": "uuid"}
_TIMESTAMP = {"type": "string", "format": "date-time"}
_PROBLEM_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["path", "message"],
        "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
    },
}

CREATE_REQUEST_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["flowId", "data"],
    "additionalProperties": False,
    "properties": {
        "flowId": {**_UUID, "description": "A flow of the caller's organization."},
        "data": {
            "type": "object",
            "description": "Validated against the flow's dataSchema; at most 256 KiB as JSON.",
        },
        "machineId": {"type": "string", "minLength": 1, "maxLength": 200},
    },
}

TRANSITION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["transition", "expectedRevision"],
    "additionalProperties": False,
    "properties": {
        "transition": {"type": "string", "minLength": 1, "maxLength": 200},
        "expectedRevision": {"type": "integer", "minimum": 1, "maximum": 2147483647},
        "simulation": {
            "type": "boolean",
            "description": (
                "Reserved for dry runs, which are not available yet: true is refused "
                "with 422 SIMULATION_NOT_AVAILABLE; false runs the transition."
            ),
        },
    },
}

FLOW_CREATED: dict[str, Any] = {
    "type": "object",
    "required": ["id", "key", "version", "trigger"],
    "properties": {
        "id": _UUID,
        "key": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "trigger": {"type": "string"},
        "warnings": _PROBLEM_LIST,
    },
}

FLOW: dict[str, Any] = {
    "type": "object",
    "required": ["id", "key", "version", "trigger", "createdBy", "createdAt", "definition"],
    "properties": {
        "id": _UUID,
        "key": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "trigger": {"type": "string"},
        "createdBy": {"type": "string"},
        "createdAt": _TIMESTAMP,
        "definition": {"type": "object"},
    },
}

REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["id", "flowId", "state", "revision", "data"],
    "properties": {
        "id": _UUID,
        "flowId": _UUID,
        "state": {"type": "string"},
        "revision": {"type": "integer", "minimum": 1},
        "data": {"type": "object"},
        "machineId": {"type": "string"},
        "executionId": {
            **_UUID,
            "description": "The unfinished execution, else the latest one.",
        },
    },
}

TRANSITION_ACCEPTED: dict[str, Any] = {
    "type": "object",
    "required": ["executionId"],
    "properties": {"executionId": _UUID},
}

EXECUTION: dict[str, Any] = {
    "type": "object",
    "required": [
        "id",
        "requestId",
        "flowId",
        "transitionId",
        "status",
        "attempts",
        "steps",
        "createdAt",
        "updatedAt",
    ],
    "additionalProperties": False,
    "properties": {
        "id": _UUID,
        "requestId": _UUID,
        "flowId": _UUID,
        "transitionId": {"type": "string"},
        "status": {"enum": list(EXECUTION_STATUSES)},
        "outcome": {"description": "The business outcome the decision table chose."},
        "toState": {"type": "string"},
        "errorCode": {"type": "string"},
        "errorDetail": {
            "type": "object",
            "description": (
                "Where the failure was: the action (`actionId`), the JSON Pointer that did not"
                " resolve (`pointer`, `field`), the schema paths that failed (`paths`,"
                " `problems`), the writes succeeded or in doubt. Names and paths, never values."
            ),
        },
        "nextAttemptAt": {
            **_TIMESTAMP,
            "description": "When a RETRY_WAIT execution becomes due again.",
        },
        "attempts": {"type": "integer", "minimum": 0},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["actionId", "status", "attempts"],
                "additionalProperties": False,
                "properties": {
                    "actionId": {"type": "string"},
                    "status": {"enum": ["RUNNING", "SUCCEEDED", "FAILED", "UNKNOWN"]},
                    "startedAt": _TIMESTAMP,
                    "finishedAt": _TIMESTAMP,
                    "errorCode": {"type": "string"},
                    "nextAttemptAt": _TIMESTAMP,
                    "attempts": {
                        "type": "array",
                        "description": "Every attempt of the step, oldest first.",
                        "items": {
                            "type": "object",
                            "required": ["attempt", "status", "startedAt"],
                            "additionalProperties": False,
                            "properties": {
                                "attempt": {"type": "integer", "minimum": 1},
                                "status": {
                                    "enum": ["RUNNING", "SUCCEEDED", "FAILED", "UNKNOWN"],
                                    "description": (
                                        "UNKNOWN: the effect may have happened. An attempt"
                                        " interrupted mid-call ends FAILED (a read) or"
                                        " UNKNOWN (a write) with errorCode INTERRUPTED."
                                    ),
                                },
                                "errorCode": {"type": "string"},
                                "message": {
                                    "type": "string",
                                    "maxLength": 1024,
                                    "description": (
                                        "The adapter's own words, cut to 1 KiB, with the"
                                        " call's input strings blanked out."
                                    ),
                                },
                                "startedAt": _TIMESTAMP,
                                "finishedAt": _TIMESTAMP,
                            },
                        },
                    },
                },
            },
        },
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
    },
}

PROBLEM: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "code"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "code": {"type": "string"},
        "detail": {"type": "string"},
        "problems": _PROBLEM_LIST,
    },
}

HEALTH: dict[str, Any] = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"const": "ok"}},
}
