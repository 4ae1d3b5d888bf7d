"""OpenAPI paths and schemas of rollouts (rollout@1): read one, pause, resume, cancel,
retry the failed children."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    id_parameter,
    json_response,
    open_executions_429,
    problems,
    ref,
)
from orquestador.api.rollout_routes import CANCEL_ROLLOUT_BODY, MARK_BODY
from orquestador.domain.statuses import ROLLOUT_ITEM_WAITING, RolloutChildStatus, values

_TEXT_OR_NULL = {"type": ["string", "null"]}
_COUNT = {"type": "integer", "minimum": 0}

SCHEMAS: dict[str, Any] = {
    "Rollout": {
        "type": "object",
        "description": "A rollout step's state: its children by status, its budget, its marks.",
        "properties": {
            "rolloutId": {"type": "string", "format": "uuid"},
            "executionId": {"type": "string", "format": "uuid"},
            "actionId": {"type": "string"},
            "flowId": {"type": "string", "format": "uuid", "description": "The child flow."},
            "transitionId": {"type": "string"},
            "total": _COUNT,
            "started": _COUNT,
            "running": _COUNT,
            "succeeded": _COUNT,
            "failed": _COUNT,
            "cancelled": _COUNT,
            "skipped": _COUNT,
            "batch": {"type": "integer", "minimum": 1},
            "maxFailures": _COUNT,
            "budgetSpent": {"type": "boolean"},
            "paused": {"type": "boolean"},
            "pausedBy": _TEXT_OR_NULL,
            "cancelRequested": {
                "type": "boolean",
                "description": "A person cancelled it: no child starts any more.",
            },
            "cancelledBy": _TEXT_OR_NULL,
            "live": {"type": "boolean", "description": "Its execution has not ended."},
            "retryOf": {**_TEXT_OR_NULL, "description": "The rollout whose failed it retries."},
            "children": {
                "type": "array",
                "description": "Every item in order (GET only).",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": _COUNT,
                        "item": {},
                        "status": {"enum": [*values(RolloutChildStatus), ROLLOUT_ITEM_WAITING]},
                        "requestId": _TEXT_OR_NULL,
                        "executionId": _TEXT_OR_NULL,
                        "executionStatus": _TEXT_OR_NULL,
                        "refusal": {"type": "string"},
                    },
                    "required": ["index", "item", "status"],
                },
            },
            "cancelledChildren": {
                "type": "object",
                "description": "A cancel's answer: each running child's status after it, or "
                "why it was left to finish.",
                "additionalProperties": {"type": "string"},
            },
        },
        "required": [
            "rolloutId",
            "executionId",
            "total",
            "started",
            "running",
            "succeeded",
            "failed",
            "cancelled",
            "skipped",
            "batch",
            "maxFailures",
            "budgetSpent",
            "paused",
            "cancelRequested",
            "live",
        ],
    },
    "RolloutMark": MARK_BODY,
    "RolloutCancel": CANCEL_ROLLOUT_BODY,
    "RolloutRetried": {
        "type": "object",
        "properties": {
            "retryOf": {"type": "string", "format": "uuid"},
            "requestId": {"type": "string", "format": "uuid"},
            "executionId": {"type": "string", "format": "uuid"},
            "items": {"type": "integer", "minimum": 1},
        },
        "required": ["retryOf", "requestId", "executionId", "items"],
    },
}

_CONTROL = (
    "Scope `executions:cancel`, or `requests:write` for one's own request. Audited on the "
    "execution. 409 `ROLLOUT_ENDED` once the rollout's execution has ended."
)


def _mark(operation: str, summary: str, schema: str, more: str = "") -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            "description": _CONTROL + more,
            "security": SECURED,
            "parameters": [id_parameter("executionId")],
            "requestBody": body(ref(schema)),
            "responses": {
                "200": json_response(ref("Rollout"), "The rollout as it is now."),
                **problems(*WRITE_ERRORS, "404", "409"),
            },
        }
    }


def paths() -> dict[str, Any]:
    return {
        "/executions/{executionId}/rollout": {
            "get": {
                "operationId": "getRollout",
                "summary": "The execution's rollout: counts, budget, marks and children",
                "description": "Scope `requests:read`, as reading the execution. 404 when the "
                "execution has no rollout step.",
                "security": SECURED,
                "parameters": [id_parameter("executionId")],
                "responses": {
                    "200": json_response(ref("Rollout"), "The rollout."),
                    **problems(*READ_ERRORS),
                },
            }
        },
        "/executions/{executionId}/rollout/pause": _mark(
            "pauseRollout",
            "Pause a rollout: no new child starts until it resumes",
            "RolloutMark",
        ),
        "/executions/{executionId}/rollout/resume": _mark(
            "resumeRollout", "Resume a paused rollout", "RolloutMark"
        ),
        "/executions/{executionId}/rollout/cancel": _mark(
            "cancelRollout",
            "Cancel a rollout: no new child, the running ones cancelled under the write rule",
            "RolloutCancel",
            " A child with a write done or in doubt parks for a person; one whose step is in "
            "flight finishes by itself. The step then fails `ROLLOUT_CANCELLED`.",
        ),
        "/executions/{executionId}/rollout/retry-failed": {
            "post": {
                "operationId": "retryFailedRollout",
                "summary": "Retry the failed children: a new run over just those items",
                "description": "Scope `executions:reconcile`. A new request of the same flow "
                "version and data, its transition accepted, whose rollout step runs over the "
                "failed items only. 409 `ROLLOUT_ENDED` while the rollout still runs, "
                "`ROLLOUT_NOTHING_TO_RETRY` when no child failed.",
                "security": SECURED,
                "parameters": [id_parameter("executionId")],
                "requestBody": body(ref("RolloutMark")),
                "responses": {
                    "202": json_response(
                        ref("RolloutRetried"), "The new run.", Location="The new execution."
                    ),
                    **problems(*WRITE_ERRORS, "404", "409"),
                    **open_executions_429(),
                },
            }
        },
    }
