"""OpenAPI paths and schemas of approvals (approval@1's decisions)."""

from __future__ import annotations

from typing import Any

from orquestador.api.approval_routes import DECISION_BODY, MAX_PAGE_SIZE, STATUSES
from orquestador.api.openapi.parts import (
    QUERY_INVALID,
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    id_parameter,
    json_response,
    problems,
    query_parameter,
    ref,
)
from orquestador.db.schema import APPROVAL_STATUSES

_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_NULLABLE_TEXT = {"type": ["string", "null"]}

SCHEMAS: dict[str, Any] = {
    "Approval": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "executionId": {"type": "string", "format": "uuid"},
            "requestId": {"type": "string", "format": "uuid"},
            "actionId": {"type": "string"},
            "title": {"type": "string"},
            "body": {"type": "string"},
            "approvers": {
                "type": "object",
                "properties": {
                    "subjects": {"type": "array", "items": {"type": "string"}},
                    "scope": _NULLABLE_TEXT,
                },
                "required": ["subjects", "scope"],
            },
            "status": {"type": "string", "enum": list(APPROVAL_STATUSES)},
            "open": {
                "type": "boolean",
                "description": "Whether a decision is still taken: open, before its deadline, "
                "and its execution still live.",
            },
            "deadlineAt": {"type": "string", "format": "date-time"},
            "decidedBy": _NULLABLE_TEXT,
            "decidedAt": _NULLABLE_TIME,
            "comment": _NULLABLE_TEXT,
            "createdAt": {"type": "string", "format": "date-time"},
            "flowKey": {"type": "string", "description": "The flow whose step asks."},
            "flowVersion": {"type": "integer", "minimum": 1},
            "transitionId": {"type": "string", "description": "The transition that asks."},
            "machineId": {
                **_NULLABLE_TEXT,
                "description": "The machine the request names (else its data's `machineId`).",
            },
            "requestedBy": {
                **_NULLABLE_TEXT,
                "description": "Who asked for the transition (never an approver of it).",
            },
        },
        "required": [
            "id",
            "executionId",
            "requestId",
            "actionId",
            "title",
            "body",
            "approvers",
            "status",
            "open",
            "deadlineAt",
            "decidedBy",
            "decidedAt",
            "comment",
            "createdAt",
            "flowKey",
            "flowVersion",
            "transitionId",
            "machineId",
            "requestedBy",
        ],
    },
    "ApprovalPage": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": ref("Approval")},
            "next": {
                "type": ["string", "null"],
                "description": "Pass as `after` for the next page; null on the last one.",
            },
        },
        "required": ["items", "next"],
    },
    "ApprovalDecision": DECISION_BODY,
}

_SCOPE = (
    "Scope `approvals:decide`, and being one of the approval's approvers: a `sub` it "
    "lists, or a holder of the scope it names. Any other approval is 404."
)


def paths() -> dict[str, Any]:
    return {
        "/approvals": {
            "get": {
                "operationId": "listApprovals",
                "summary": "The approvals the caller may decide, oldest first",
                "description": _SCOPE,
                "security": SECURED,
                "parameters": [
                    query_parameter(
                        "status",
                        {"type": "string", "enum": list(STATUSES)},
                        "`open` (the default): still to decide; `closed`: decided, expired, "
                        "or whose execution ended; `all`.",
                    ),
                    query_parameter(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
                        "Page size (default 50).",
                    ),
                    query_parameter(
                        "after", {"type": "string"}, "The `next` of the previous page."
                    ),
                ],
                "responses": {
                    "200": json_response(ref("ApprovalPage"), "One page of approvals."),
                    **problems("400", "401", "403", "414", "431", s400=QUERY_INVALID),
                },
            },
        },
        "/approvals/{approvalId}": {
            "get": {
                "operationId": "getApproval",
                "summary": "One approval",
                "description": _SCOPE,
                "security": SECURED,
                "parameters": [id_parameter("approvalId")],
                "responses": {
                    "200": json_response(ref("Approval"), "The approval."),
                    **problems(*READ_ERRORS),
                },
            },
        },
        "/approvals/{approvalId}/decision": {
            "post": {
                "operationId": "decideApproval",
                "summary": "Approve or reject: one decision, audited, wakes the execution",
                "description": _SCOPE
                + " The person who asked for the transition, and the request's owner, are "
                "refused 403 `SELF_APPROVAL`. A decided or expired approval, one past its "
                "deadline, or one whose execution ended (a cancel that commits while "
                "the decision waits for its lock included) is 409 `APPROVAL_CLOSED`, its "
                "`detail` saying which in words: of a decision and the deadline, exactly "
                "one wins.",
                "security": SECURED,
                "parameters": [id_parameter("approvalId")],
                "requestBody": body(ref("ApprovalDecision")),
                "responses": {
                    "200": json_response(ref("Approval"), "Decided."),
                    **problems(
                        *WRITE_ERRORS,
                        "404",
                        "409",
                        s403="The token lacks the scope (`INSUFFICIENT_SCOPE`), or the caller "
                        "asked for the transition or owns the request (`SELF_APPROVAL`).",
                        s409="Already decided, expired, past its deadline, or its execution "
                        "ended (`APPROVAL_CLOSED`).",
                    ),
                },
            },
        },
    }
