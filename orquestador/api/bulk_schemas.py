"""JSON Schemas of the bulk action routes' bodies and answers, for body checks and OpenAPI."""

from __future__ import annotations

from typing import Any

from orquestador.db.schema import BULK_ACTIONS, BULK_STATUSES, EXECUTION_STATUSES
from orquestador.queue.bulk import MAX_ITEMS

_UUID = {"type": "string", "format": "uuid"}
_TIMESTAMP = {"type": "string", "format": "date-time"}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 200}

BULK_FILTER: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "description": "Every real execution of the caller's organization that matches all the "
    "criteria given (at least one). Dry runs are never taken.",
    "properties": {
        "status": {"enum": list(EXECUTION_STATUSES)},
        "flowId": {**_UUID, "description": "Executions of this flow version."},
        "flowKey": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "description": "Executions of every version of this flow key.",
        },
        "errorCode": {**_TEXT, "description": "Executions whose errorCode is this."},
        "machineId": {
            **_TEXT,
            "description": "Executions of requests on this machine (the request's machineId, "
            "else its data's).",
        },
        "createdAfter": {**_TIMESTAMP, "description": "Created strictly after this instant."},
        "createdBefore": {**_TIMESTAMP, "description": "Created strictly before this instant."},
    },
}

BULK_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["filter", "action", "reason"],
    "additionalProperties": False,
    "properties": {
        "filter": BULK_FILTER,
        "action": {
            "enum": list(BULK_ACTIONS),
            "description": "cancel (scope `executions:cancel`), or the reconciliation "
            "decisions retry and fail (scope `executions:reconcile`) on parked executions.",
        },
        "reason": {
            "type": "string",
            "minLength": 1,
            "maxLength": 2000,
            "pattern": "\\S",
            "description": "Why: kept in the audit row of every execution acted on.",
        },
        "preview": {
            "type": "boolean",
            "description": "true: only count the matches and show a sample; nothing is "
            "recorded or changed.",
        },
    },
}

BULK_SAMPLE_ITEM: dict[str, Any] = {
    "type": "object",
    "required": ["id", "requestId", "status", "errorCode", "flowKey", "flowVersion", "createdAt"],
    "properties": {
        "id": _UUID,
        "requestId": _UUID,
        "status": {"enum": list(EXECUTION_STATUSES)},
        "errorCode": {"type": ["string", "null"]},
        "flowKey": {"type": "string"},
        "flowVersion": {"type": "integer"},
        "machineId": {"type": ["string", "null"]},
        "createdAt": _TIMESTAMP,
        "parks": {
            "type": "boolean",
            "description": "A cancel only: true when a cancel now would park this execution "
            "for an operator's decision (a write done or in doubt) rather than end it.",
        },
    },
}

BULK_PREVIEW: dict[str, Any] = {
    "type": "object",
    "required": ["action", "count", "sample"],
    "properties": {
        "action": {"enum": list(BULK_ACTIONS)},
        "count": {"type": "integer", "minimum": 0, "description": "How many match now."},
        "parks": {
            "type": "integer",
            "minimum": 0,
            "description": "A cancel only: how many of them a cancel now would park for an "
            "operator's decision (a write done or in doubt) rather than end.",
        },
        "sample": {
            "type": "array",
            "items": BULK_SAMPLE_ITEM,
            "description": "The newest matches, at most 10.",
        },
    },
}

BULK_ACCEPTED: dict[str, Any] = {
    "type": "object",
    "required": ["bulkId", "status", "total"],
    "properties": {
        "bulkId": _UUID,
        "status": {"enum": list(BULK_STATUSES)},
        "total": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_ITEMS,
            "description": "The items: the executions that matched when it was accepted.",
        },
    },
}

_ITEM: dict[str, Any] = {
    "type": "object",
    "required": ["executionId", "code"],
    "properties": {
        "executionId": _UUID,
        "code": {"type": "string"},
        "detail": {"type": ["string", "null"]},
    },
}

BULK_PROGRESS: dict[str, Any] = {
    "type": "object",
    "required": ["id", "action", "status", "total", "done", "succeeded", "parked", "refused"],
    "properties": {
        "id": _UUID,
        "action": {"enum": list(BULK_ACTIONS)},
        "actor": {"type": "string"},
        "reason": {"type": "string"},
        "filter": {"type": "object"},
        "status": {
            "enum": list(BULK_STATUSES),
            "description": "RUNNING until every item has its outcome, then DONE.",
        },
        "total": {"type": "integer", "minimum": 0},
        "done": {"type": "integer", "minimum": 0, "description": "Items with an outcome."},
        "succeeded": {
            "type": "integer",
            "minimum": 0,
            "description": "Items acted on as asked (cancelled, retried, failed).",
        },
        "parked": {
            "type": "array",
            "description": "Cancels that took effect as a park for an operator's decision "
            "(`CANCELLED_AFTER_WRITES`: a write was done or may have been), each with what "
            "became of its machine commands (withdrawn, asked to stop). Not refusals.",
            "items": _ITEM,
        },
        "refused": {
            "type": "array",
            "description": "Every item the normal rules refused, with its problem code "
            "(`NOT_CANCELLABLE`, `NOT_RECONCILABLE`, ...); nothing was done to it.",
            "items": _ITEM,
        },
        "cancelRequested": {
            "type": "array",
            "description": "Cancels of RUNNING executions, counted in `succeeded`: each "
            "execution stops when its step's call returns (CANCELLED, or parked "
            "`CANCELLED_AFTER_WRITES` by the write rule).",
            "items": _UUID,
        },
        "createdAt": _TIMESTAMP,
        "finishedAt": {"type": ["string", "null"], "format": "date-time"},
    },
}
