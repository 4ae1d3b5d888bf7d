"""Problem details (RFC 9457): the one shape of every error answered over HTTP, by the
API, the worker's probe and the HTTP servers' own refusals."""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from orquestador.errors import Problem

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://orquestador.dev/problems/"

# The codes werkzeug's own exceptions become; anything else falls back to HTTP_<status>.
_CODES_BY_STATUS = {
    400: "MALFORMED_REQUEST",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "BODY_TOO_LARGE",
    414: "URI_TOO_LONG",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "BODY_INVALID",
    431: "HEADERS_TOO_LARGE",
    500: "INTERNAL",
    503: "SERVICE_UNAVAILABLE",
}


def problem_type(code: str) -> str:
    """The stable type URI of a code: lower case, hyphens for underscores."""
    return TYPE_BASE + code.lower().replace("_", "-")


def code_for_status(status: int) -> str:
    """The code of an error nobody named more precisely (werkzeug's, the HTTP server's)."""
    return _CODES_BY_STATUS.get(status, f"HTTP_{status}")


def problem_document(
    status: int, code: str, detail: str | None = None, *, problems: Iterable[Problem] = ()
) -> dict[str, Any]:
    """The problem body; the HTTP servers' own refusals (serve.py) use it too."""
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": HTTPStatus(status).phrase,
        "status": status,
        "code": code,
    }
    if detail:
        body["detail"] = detail
    listed = [p.as_dict() for p in problems]
    if listed:
        body["problems"] = listed
    return body
