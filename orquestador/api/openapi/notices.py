"""OpenAPI paths and schemas of panel notices and notification preferences."""

from __future__ import annotations

from typing import Any

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
from orquestador.notices.preferences import MAX_RECIPIENTS
from orquestador.notices.vocabulary import CATEGORIES, SEVERITIES, EmailOutcome

_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_NULLABLE_ID = {"type": ["string", "null"], "format": "uuid"}

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
    "Notice": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "category": {"type": "string", "enum": list(CATEGORIES)},
            "severity": {"type": "string", "enum": list(SEVERITIES)},
            "title": {"type": "string"},
            "body": {"type": "string"},
            "email": {
                "type": "string",
                "enum": [outcome.value for outcome in EmailOutcome],
                "description": "What became of the e-mail: `queued` (an e-mail was queued and "
                "is not settled yet), `delivered` (the SMTP server accepted it), `failed` "
                "(refused for good or given up), `off_on_node` (the flow's node did not ask "
                "for one), `org_opted_out`, `no_recipients` (the organization names nobody), "
                "`simulation` (a dry run).",
            },
            "test": {"type": "boolean", "description": "Written by a dry run; never e-mailed."},
            "requestId": _NULLABLE_ID,
            "executionId": _NULLABLE_ID,
            "createdAt": {"type": "string", "format": "date-time"},
            "dismissedAt": _NULLABLE_TIME,
            "dismissedBy": {
                "type": ["string", "null"],
                "description": "Who dismissed it first (their token's subject).",
            },
        },
        "required": [
            "id",
            "category",
            "severity",
            "title",
            "body",
            "email",
            "test",
            "createdAt",
            "dismissedAt",
            "dismissedBy",
        ],
    },
    "NoticePage": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": ref("Notice")},
            "next": {
                "type": ["string", "null"],
                "description": "Pass as `after` for the next page; null on the last one.",
            },
        },
        "required": ["items", "next"],
    },
    "NotificationPreferencesBody": {
        "type": "object",
        "properties": {
            "optOut": {
                "type": "array",
                "items": {"type": "string", "enum": list(CATEGORIES)},
                "description": "Categories whose notices are never e-mailed to this "
                "organization, whatever the flow's node asks.",
            },
            "recipients": {
                "type": "array",
                "maxItems": MAX_RECIPIENTS,
                "items": {"type": "string", "format": "email", "maxLength": 254},
                "description": "Plain addresses (no display name); duplicates are dropped.",
            },
        },
        "required": ["optOut", "recipients"],
        "additionalProperties": False,
    },
    "NotificationPreferences": {
        "type": "object",
        "properties": {
            "org": {"type": "string"},
            "optOut": {"type": "array", "items": {"type": "string"}},
            "recipients": {"type": "array", "items": {"type": "string"}},
            "updatedAt": _NULLABLE_TIME,
        },
        "required": ["org", "optOut", "recipients", "updatedAt"],
    },
}

_ORG_PARAMETER = {
    "name": "org",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The caller's own organization (the token's `org`); any other is 404.",
}
_OWN_ORG_404 = "Not the caller's organization (the same answer as an unknown path)."


def paths() -> dict[str, Any]:
    return {
        "/notices": {
            "get": {
                "operationId": "listNotices",
                "summary": "The organization's panel notices, newest first",
                "description": "Scope `notices:read`. Dismissed notices only with "
                "`includeDismissed=true`. The panel is the real runs': a dry run's notices "
                "(`test: true`) are listed only with `test=true`, and then alone.",
                "security": SECURED,
                "parameters": [
                    query_parameter(
                        "includeDismissed",
                        {"type": "string", "enum": ["true", "false"]},
                        "Also list dismissed notices (default false).",
                    ),
                    query_parameter(
                        "test",
                        {"type": "string", "enum": ["true", "false"]},
                        "true: the dry runs' notices instead of the real ones (default false).",
                    ),
                    query_parameter(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 200},
                        "Page size (default 50).",
                    ),
                    query_parameter(
                        "after", {"type": "string"}, "The `next` of the previous page."
                    ),
                ],
                "responses": {
                    "200": json_response(ref("NoticePage"), "One page of notices."),
                    **problems("400", "401", "403", "414", "431", s400=QUERY_INVALID),
                },
            },
        },
        "/notices/{noticeId}/dismiss": {
            "post": {
                "operationId": "dismissNotice",
                "summary": "Dismiss a notice (again is fine: the first time is kept)",
                "description": "Scope `notices:read`. No body.",
                "security": SECURED,
                "parameters": [id_parameter("noticeId")],
                "responses": {
                    "200": json_response(ref("Notice"), "The dismissed notice."),
                    **problems(*READ_ERRORS),
                },
            },
        },
        "/orgs/{org}/notification-preferences": {
            "get": {
                "operationId": "readNotificationPreferences",
                "summary": "The organization's opt-outs and e-mail recipients",
                "description": "Scope `org:admin`, own organization only. Never set: "
                "nothing opted out and no recipients.",
                "security": SECURED,
                "parameters": [_ORG_PARAMETER],
                "responses": {
                    "200": json_response(ref("NotificationPreferences"), "The preferences."),
                    **problems(*READ_ERRORS, s404=_OWN_ORG_404),
                },
            },
            "put": {
                "operationId": "replaceNotificationPreferences",
                "summary": "Replace the organization's opt-outs and e-mail recipients",
                "description": "Scope `org:admin`, own organization only. An unknown "
                "category or an unusable address is 422 `PREFERENCES_INVALID` naming each "
                "at its JSON Pointer; nothing is changed then.",
                "security": SECURED,
                "parameters": [_ORG_PARAMETER],
                "requestBody": body(ref("NotificationPreferencesBody")),
                "responses": {
                    "200": json_response(ref("NotificationPreferences"), "Saved."),
                    **problems(*WRITE_ERRORS, "404", s404=_OWN_ORG_404),
                },
            },
        },
    }
