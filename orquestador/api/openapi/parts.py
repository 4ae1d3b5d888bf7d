"""Building blocks of the OpenAPI document, shared by the core paths and each area's paths."""

from __future__ import annotations

from typing import Any


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_response(schema: dict[str, Any], description: str, **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return response


PROBLEM_TEXT = {
    "400": "The body is not valid JSON.",
    "401": "The bearer token is missing or invalid.",
    "403": "The token lacks the operation's scope.",
    "404": "No such resource, or not visible to the caller (the same answer either way).",
    "409": "The request is busy with an unfinished execution, or its revision differs.",
    "413": "The body is larger than API_MAX_BODY_BYTES.",
    "414": "The request line is longer than 4094 bytes.",
    "415": "The body is not application/json.",
    "422": "The body, definition or data is invalid; `problems` lists every problem.",
    "431": "More than 100 header fields, or one longer than 8190 bytes.",
    "503": "The database is unavailable.",
}


def problems(*statuses: str, **texts: str) -> dict[str, Any]:
    """Problem answers; `texts` replaces the usual description, keyed `s409=...`."""
    return {
        status: {
            "description": texts.get(f"s{status}", PROBLEM_TEXT[status]),
            "content": {"application/problem+json": {"schema": ref("Problem")}},
        }
        for status in statuses
    }


def query_parameter(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


QUERY_INVALID = "A query parameter is invalid (`QUERY_INVALID`); `problems` names it."


def flow_parameter() -> dict[str, Any]:
    """`{flowId}`: a flow version's id, or a flow key, which names its latest version."""
    return {
        "name": "flowId",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 100},
        "description": "A flow version's id, or a flow key (its latest version).",
    }


def id_parameter(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    }


def body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


SECURED = [{"bearerAuth": []}]
# Every operation can meet the request-head limits (docs/API.md, "Limits").
READ_ERRORS = ("401", "403", "404", "414", "431")
WRITE_ERRORS = ("400", "401", "403", "413", "414", "415", "422", "431")


# Why an operation that starts an execution may answer 429, besides a token.
_OPEN_EXECUTIONS = (
    "`QUOTA_EXCEEDED`, the problem naming `openExecutions`: the organization holds as "
    "many executions not ended as its quota allows; ask again after `Retry-After` seconds."
)


def transitions_quota_429() -> dict[str, Any]:
    """The 429 of an operation that asks for a transition: the organization's bucket, or
    its quota of open executions."""
    return {
        "429": {
            "description": "`QUOTA_EXCEEDED`: the organization's quota `transitionsPerSecond` "
            "(a token bucket shared by every API process: `transitionsPerSecond` on average, "
            "`transitionsBurst` at once) is used up. Ask again after `Retry-After` seconds. "
            f"Or {_OPEN_EXECUTIONS}",
            "headers": {
                "Retry-After": {
                    "description": "Seconds until the bucket holds a token again (30 for "
                    "`openExecutions`).",
                    "schema": {"type": "integer", "minimum": 1},
                }
            },
            "content": {"application/problem+json": {"schema": ref("Problem")}},
        }
    }


def open_executions_429() -> dict[str, Any]:
    """The 429 of an operation that starts an execution without taking a transition token."""
    return {
        "429": {
            "description": _OPEN_EXECUTIONS,
            "headers": {
                "Retry-After": {
                    "description": "Seconds to wait before asking again.",
                    "schema": {"type": "integer", "minimum": 1},
                }
            },
            "content": {"application/problem+json": {"schema": ref("Problem")}},
        }
    }
