"""The OpenAPI 3.1 document of the API, built from the same schemas the views check bodies with."""

from __future__ import annotations

import copy
import functools
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api import schemas
from orquestador.api.views import API_PREFIX
from orquestador.domain.flow_definition import definition_schema

blueprint = Blueprint("openapi", __name__)

_FLOW_PREFIX = "FlowDefinition_"


def _flow_definition_components() -> dict[str, Any]:
    """The flow definition schema, its $defs lifted into components so any tool resolves them."""
    schema = definition_schema()
    defs = schema.pop("$defs", {})
    for key in ("$schema", "$id"):
        schema.pop(key, None)

    def relink(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (
                    "#/components/schemas/" + _FLOW_PREFIX + v.removeprefix("#/$defs/")
                    if k == "$ref" and isinstance(v, str) and v.startswith("#/$defs/")
                    else relink(v)
                )
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [relink(item) for item in node]
        return node

    components = {"FlowDefinition": relink(schema)}
    components.update({_FLOW_PREFIX + name: relink(d) for name, d in defs.items()})
    return components


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str, **headers: str) -> dict[str, Any]:
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


_PROBLEM_TEXT = {
    "400": "The body is not valid JSON.",
    "401": "The bearer token is missing or invalid.",
    "403": "The token lacks the operation's scope.",
    "404": "No such resource, or not visible to the caller (the same answer either way).",
    "409": "The request is busy with an unfinished execution, or its revision differs.",
    "413": "The body is larger than API_MAX_BODY_BYTES.",
    "415": "The body is not application/json.",
    "422": "The body, definition or data is invalid; `problems` lists every problem.",
    "503": "The database is unavailable.",
}


def _problems(*statuses: str) -> dict[str, Any]:
    return {
        status: {
            "description": _PROBLEM_TEXT[status],
            "content": {"application/problem+json": {"schema": _ref("Problem")}},
        }
        for status in statuses
    }


def _id_parameter(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    }


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_SECURED = [{"bearerAuth": []}]
_READ_ERRORS = ("401", "403", "404")
_WRITE_ERRORS = ("400", "401", "403", "413", "415", "422")


def _paths() -> dict[str, Any]:
    health = {"200": _json(schemas.HEALTH, "The process is alive.")}
    ready = {"200": _json(schemas.HEALTH, "The database answers."), **_problems("503")}
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness",
                "security": [],
                "responses": health,
            },
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness (checks the database)",
                "security": [],
                "responses": ready,
            },
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "The OpenAPI document.")},
            },
        },
        "/flows": {
            "post": {
                "operationId": "publishFlow",
                "summary": "Publish a flow definition as the next version of its key",
                "description": "Scope `flows:admin`.",
                "security": _SECURED,
                "requestBody": _body(_ref("FlowDefinition")),
                "responses": {
                    "201": _json(_ref("FlowCreated"), "Published.", Location="The new flow."),
                    **_problems(*_WRITE_ERRORS),
                },
            },
        },
        "/flows/{flowId}": {
            "get": {
                "operationId": "getFlow",
                "summary": "A published flow of the caller's organization",
                "description": "Scope `flows:admin`.",
                "security": _SECURED,
                "parameters": [_id_parameter("flowId")],
                "responses": {"200": _json(_ref("Flow"), "The flow."), **_problems(*_READ_ERRORS)},
            },
        },
        "/requests": {
            "post": {
                "operationId": "createRequest",
                "summary": "Start a request on a flow, in the flow's initial state",
                "description": "Scope `requests:write`.",
                "security": _SECURED,
                "requestBody": _body(_ref("CreateRequest")),
                "responses": {
                    "201": _json(_ref("Request"), "Created.", Location="The new request."),
                    **_problems(*_WRITE_ERRORS),
                },
            },
        },
        "/requests/{requestId}": {
            "get": {
                "operationId": "getRequest",
                "summary": "A request the caller may see",
                "description": "Scope `requests:read`; `requests:read-all` sees every "
                "request of the organization.",
                "security": _SECURED,
                "parameters": [_id_parameter("requestId")],
                "responses": {
                    "200": _json(_ref("Request"), "The request."),
                    **_problems(*_READ_ERRORS),
                },
            },
        },
        "/requests/{requestId}/transitions": {
            "post": {
                "operationId": "requestTransition",
                "summary": "Accept a transition; an execution runs it asynchronously",
                "description": "Scope `requests:write`.",
                "security": _SECURED,
                "parameters": [_id_parameter("requestId")],
                "requestBody": _body(_ref("TransitionRequest")),
                "responses": {
                    "202": _json(
                        _ref("TransitionAccepted"), "Accepted.", Location="The execution."
                    ),
                    **_problems(*_WRITE_ERRORS, "404", "409"),
                },
            },
        },
        "/executions/{executionId}": {
            "get": {
                "operationId": "getExecution",
                "summary": "The ExecutionView of an accepted transition",
                "description": "Scope `requests:read`.",
                "security": _SECURED,
                "parameters": [_id_parameter("executionId")],
                "responses": {
                    "200": _json(_ref("ExecutionView"), "The execution."),
                    **_problems(*_READ_ERRORS),
                },
            },
        },
    }


@functools.cache
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "orquestador",
            "version": "1",
            "description": "Durable workflow orchestrator: flows, requests, transitions "
            "and executions. Errors are application/problem+json.",
        },
        "servers": [{"url": API_PREFIX}],
        "security": _SECURED,
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
            "schemas": {
                "CreateRequest": schemas.CREATE_REQUEST_BODY,
                "TransitionRequest": schemas.TRANSITION_BODY,
                "FlowCreated": schemas.FLOW_CREATED,
                "Flow": schemas.FLOW,
                "Request": schemas.REQUEST,
                "TransitionAccepted": schemas.TRANSITION_ACCEPTED,
                "ExecutionView": schemas.EXECUTION,
                "Problem": schemas.PROBLEM,
                "Health": schemas.HEALTH,
                **_flow_definition_components(),
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    """A copy of the document, safe to modify."""
    return copy.deepcopy(_document())


@blueprint.get(f"{API_PREFIX}/openapi.json")
def serve() -> Response:
    return jsonify(_document())
