"""The OpenAPI 3.1 document of the API, built from the same schemas the views check bodies with."""

from __future__ import annotations

import copy
import functools
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api import schemas
from orquestador.api.openapi import (
    agent,
    approvals,
    auth,
    automation,
    bulk,
    machines,
    notices,
    quotas,
    rollouts,
    schedules,
)
from orquestador.api.openapi.parts import (
    QUERY_INVALID,
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    flow_parameter,
    id_parameter,
    json_response,
    problems,
    query_parameter,
    ref,
    transitions_quota_429,
)
from orquestador.api.views import API_PREFIX
from orquestador.db.schema import EXECUTION_STATUSES
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


def _core_paths() -> dict[str, Any]:
    health = {"200": json_response(schemas.HEALTH, "The process is alive.")}
    ready = {"200": json_response(schemas.HEALTH, "The database answers."), **problems("503")}
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
                "responses": {"200": json_response({"type": "object"}, "The OpenAPI document.")},
            },
        },
        "/flows": {
            "get": {
                "operationId": "listFlows",
                "summary": "Every version of the organization's flows",
                "description": "Scope `flows:admin`. By key, newest version first.",
                "security": SECURED,
                "parameters": [
                    query_parameter(
                        "key",
                        {"type": "string", "minLength": 1, "maxLength": 100},
                        "Only this flow key.",
                    )
                ],
                "responses": {
                    "200": json_response(ref("FlowVersions"), "The versions."),
                    **problems("400", "401", "403", s400=QUERY_INVALID),
                },
            },
            "post": {
                "operationId": "publishFlow",
                "summary": "Publish a flow definition as the next version of its key",
                "description": "Scope `flows:admin`.",
                "security": SECURED,
                "requestBody": body(ref("FlowDefinition")),
                "responses": {
                    "201": json_response(
                        ref("FlowCreated"), "Published.", Location="The new flow."
                    ),
                    **problems(*WRITE_ERRORS),
                },
            },
        },
        "/flows/{flowId}": {
            "get": {
                "operationId": "getFlow",
                "summary": "A published flow of the caller's organization",
                "description": "Scope `flows:admin`. By a version's id, or by a key: its "
                "latest version.",
                "security": SECURED,
                "parameters": [flow_parameter()],
                "responses": {
                    "200": json_response(ref("Flow"), "The flow."),
                    **problems(*READ_ERRORS),
                },
            },
        },
        "/capabilities": {
            "get": {
                "operationId": "listCapabilities",
                "summary": "The capability catalogue flows may name",
                "description": "Scope `flows:admin`. Each adapter's declared contract, by "
                "capability, then version; never how it reaches its provider.",
                "security": SECURED,
                "responses": {
                    "200": json_response(ref("Capabilities"), "The catalogue."),
                    **problems("401", "403", "414", "431"),
                },
            },
        },
        "/requests": {
            "post": {
                "operationId": "createRequest",
                "summary": "Start a request on a flow, in the flow's initial state",
                "description": "Scope `requests:write`.",
                "security": SECURED,
                "requestBody": body(ref("CreateRequest")),
                "responses": {
                    "201": json_response(ref("Request"), "Created.", Location="The new request."),
                    **problems(*WRITE_ERRORS),
                },
            },
        },
        "/requests/{requestId}": {
            "get": {
                "operationId": "getRequest",
                "summary": "A request the caller may see",
                "description": "Scope `requests:read`; `requests:read-all` sees every "
                "request of the organization.",
                "security": SECURED,
                "parameters": [id_parameter("requestId")],
                "responses": {
                    "200": json_response(ref("Request"), "The request."),
                    **problems(*READ_ERRORS),
                },
            },
        },
        "/requests/{requestId}/transitions": {
            "post": {
                "operationId": "requestTransition",
                "summary": "Accept a transition; an execution runs it asynchronously",
                "description": "Scope `requests:write`.",
                "security": SECURED,
                "parameters": [id_parameter("requestId")],
                "requestBody": body(ref("TransitionRequest")),
                "responses": {
                    "202": json_response(
                        ref("TransitionAccepted"), "Accepted.", Location="The execution."
                    ),
                    **problems(*WRITE_ERRORS, "404", "409"),
                    **transitions_quota_429(),
                },
            },
        },
        "/runs": {
            "post": {
                "operationId": "startRun",
                "summary": "Start a real run: a new request and its first transition, in one call",
                "description": "Scope `requests:write`. `flow` is a flow key (its latest "
                "version) or a flow version's id. One transaction creates the request in the "
                "flow's initial state and accepts `transition` at its first revision, with the "
                "checks and problems of `POST /requests` and `POST /requests/{id}/transitions`: "
                "422 `FLOW_UNKNOWN` (`/flow`), `TRANSITION_UNKNOWN` or `TRANSITION_NOT_ALLOWED` "
                "(`/transition`, which must leave the initial state), `DATA_INVALID` "
                "(`/data/...`), `CONCURRENCY_KEY_MISSING`; nothing is written when one is "
                "refused.",
                "security": SECURED,
                "requestBody": body(ref("RunRequest")),
                "responses": {
                    "202": json_response(ref("RunStarted"), "Accepted.", Location="The execution."),
                    **problems(*WRITE_ERRORS),
                    **transitions_quota_429(),
                },
            },
        },
        "/executions": {
            "get": {
                "operationId": "listExecutions",
                "summary": "Executions the caller may see, newest first, one page at a time",
                "description": "Scope `requests:read` (executions of the caller's own "
                "requests); `requests:read-all` lists every execution of the organization.",
                "security": SECURED,
                "parameters": [
                    query_parameter(
                        "status", {"enum": list(EXECUTION_STATUSES)}, "Only this status."
                    ),
                    query_parameter(
                        "flowId",
                        {"type": "string", "format": "uuid"},
                        "Only executions of this flow version.",
                    ),
                    query_parameter(
                        "requestId",
                        {"type": "string", "format": "uuid"},
                        "Only executions of this request.",
                    ),
                    query_parameter(
                        "flowKey",
                        {"type": "string", "minLength": 1, "maxLength": 200},
                        "Only executions of this flow key (any version).",
                    ),
                    query_parameter(
                        "errorCode",
                        {"type": "string", "minLength": 1, "maxLength": 200},
                        "Only executions whose errorCode is this.",
                    ),
                    query_parameter(
                        "machineId",
                        {"type": "string", "minLength": 1, "maxLength": 200},
                        "Only executions of requests on this machine (the request's "
                        "machineId, else its data's).",
                    ),
                    query_parameter(
                        "createdAfter",
                        {"type": "string", "format": "date-time"},
                        "Only executions created strictly after this instant (with its "
                        "offset, or Z).",
                    ),
                    query_parameter(
                        "createdBefore",
                        {"type": "string", "format": "date-time"},
                        "Only executions created strictly before this instant (with its "
                        "offset, or Z).",
                    ),
                    query_parameter(
                        "parentExecutionId",
                        {"type": "string", "format": "uuid"},
                        "Only the children this rollout step's execution started.",
                    ),
                    query_parameter(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                        "Page size.",
                    ),
                    query_parameter(
                        "after",
                        {"type": "string", "maxLength": 200},
                        "The `next` of the previous page (opaque).",
                    ),
                    query_parameter(
                        "simulation",
                        {"type": "boolean", "default": False},
                        "true lists only dry runs (simulated executions); without it they "
                        "are left out.",
                    ),
                    query_parameter(
                        "id",
                        {"type": "string", "pattern": "^[0-9a-fA-F-]{8,36}$"},
                        "Only the executions whose id starts with these hex digits (a whole "
                        "id, or a short id of at least 8; dashes are ignored), real or dry "
                        "run alike: how a short id is resolved.",
                    ),
                ],
                "responses": {
                    "200": json_response(ref("ExecutionPage"), "One page."),
                    **problems("400", "401", "403", s400=QUERY_INVALID),
                },
            },
        },
        "/executions/{executionId}": {
            "get": {
                "operationId": "getExecution",
                "summary": "The ExecutionView of an accepted transition; or wait for it to settle",
                "description": "Scope `requests:read`. With `waitFor=final` the answer waits, "
                "up to `timeout` seconds (at most 30), until the execution has settled: it "
                "ended (SUCCEEDED, FAILED, CANCELLED), it is parked for a person "
                "(RECONCILIATION_REQUIRED), or it waits on an approval "
                "(`waitingForApproval`); then, or at the timeout, it answers the view as it "
                "is (check `status`, and ask again to wait longer). A wait holds one of the "
                "API process's request threads, so waits may hold at most "
                "`EXECUTION_WAIT_SHARE` of them; beyond it a wait answers 429 at once, with "
                "`Retry-After`.",
                "security": SECURED,
                "parameters": [
                    id_parameter("executionId"),
                    query_parameter(
                        "waitFor",
                        {"enum": ["final"]},
                        "`final`: wait until the execution has settled (see above).",
                    ),
                    query_parameter(
                        "timeout",
                        {"type": "number", "minimum": 0, "maximum": 30, "default": 30},
                        "With `waitFor`: the longest the answer waits, in seconds (0 to 30).",
                    ),
                ],
                "responses": {
                    "200": json_response(ref("ExecutionView"), "The execution."),
                    **problems(*READ_ERRORS, "400", s400=QUERY_INVALID),
                    "429": {
                        "description": "`EXECUTION_WAITS_BUSY`: this API process already "
                        "holds all the waits its share of request threads allows. Ask again "
                        "after `Retry-After` seconds.",
                        "headers": {
                            "Retry-After": {
                                "description": "Seconds to wait before asking again.",
                                "schema": {"type": "integer", "minimum": 1},
                            }
                        },
                        "content": {"application/problem+json": {"schema": ref("Problem")}},
                    },
                },
            },
        },
        "/executions/{executionId}/evidence": {
            "get": {
                "operationId": "getExecutionEvidence",
                "summary": "What an operator needs to decide about an execution",
                "description": "Scope `executions:reconcile`; any execution of the "
                "organization. Why it parked, the step in doubt, every step's attempts, "
                "external key, input hash, effect, capability and version, the outputs of "
                "succeeded steps, and the audit trail. Never inputs, the actor snapshot, the "
                "lease owner or tokens.",
                "security": SECURED,
                "parameters": [id_parameter("executionId")],
                "responses": {
                    "200": json_response(ref("Evidence"), "The evidence."),
                    **problems(*READ_ERRORS),
                },
            },
        },
        "/executions/{executionId}/reconciliation": {
            "post": {
                "operationId": "reconcileExecution",
                "summary": "Decide about a parked execution: confirm, retry or fail",
                "description": "Scope `executions:reconcile`. One transaction with a "
                "`RECONCILIATION_RESOLVED` audit row. confirm: the step becomes SUCCEEDED with "
                "`output` and the execution continues (PENDING) without calling it again; "
                "retry: the step runs again with the same external key and a fresh attempt "
                "budget (PENDING), with the request data first corrected by `correction` "
                "when given (in the same transaction; the request takes a new revision and "
                "the audit row keeps each path's value before and after); fail: FAILED, the "
                "request moves to `toState` (default the step's onError state, else stays) "
                "and is released.",
                "security": SECURED,
                "parameters": [id_parameter("executionId")],
                "requestBody": body(ref("ReconciliationRequest")),
                "responses": {
                    "200": json_response(
                        ref("ExecutionView"), "Decided; the execution as it is now."
                    ),
                    **problems(
                        *WRITE_ERRORS,
                        "404",
                        "409",
                        s409="`NOT_RECONCILABLE`: the execution is not parked, `actionId` is "
                        "not the step in doubt, or the step does not accept this decision "
                        "(a contract mismatch takes only retry or fail), or a correction finds "
                        "the request changed since acceptance; also the loser of two decisions "
                        "at once.",
                        s422="`BODY_INVALID` (e.g. an empty reason, an unknown decision), "
                        "`OUTPUT_INVALID` (the output breaks the adapter's output schema), "
                        "`STATE_UNKNOWN` (toState), `INTEGRATION_UNAVAILABLE` (no adapter to "
                        "check the output with), `CORRECTION_INVALID` (a path or value of the "
                        "correction refused, at `/correction/N/path` or `/correction/N/value`; "
                        "a path a step that already succeeded read is refused too).",
                    ),
                },
            },
        },
        "/executions/{executionId}/cancel": {
            "post": {
                "operationId": "cancelExecution",
                "summary": "Cancel an execution (a running one when its step's call returns)",
                "description": "Scope `executions:cancel` (any execution of the organization), "
                "or `requests:write` for executions of the caller's own requests. A RUNNING "
                "execution (a step's call in flight, or a wait being checked again) is not cut "
                "mid-call: the cancel is recorded, audited `CANCEL_REQUESTED`, and the answer "
                "is the view with `cancelRequested: true` (a second cancel meanwhile answers "
                "the same); the worker applies it when the call returns, by the rule below. "
                "PENDING, RETRY_WAIT and WAITING executions with no write done or in doubt end "
                "CANCELLED and the request is released in its accepted state, audited "
                "`EXECUTION_CANCELLED`. After a write that succeeded or is in doubt the "
                "request is not released: the execution parks RECONCILIATION_REQUIRED with "
                "`errorCode` `CANCELLED_AFTER_WRITES` and `errorDetail` `{fromStatus, "
                "writesSucceeded, writesInDoubt}`, audited `RECONCILIATION_REQUIRED` with the "
                "caller and the reason, for an operator to decide. Either way, in the same "
                "transaction, the execution's machine commands that no agent has taken are "
                "cancelled and those already taken are asked to stop (`machineCommands`, "
                "also in the audit row's detail).",
                "security": SECURED,
                "parameters": [id_parameter("executionId")],
                "requestBody": body(ref("CancelRequest")),
                "responses": {
                    "200": json_response(
                        ref("CancelledExecution"),
                        "Cancelled (CANCELLED), parked for reconciliation after writes "
                        "(RECONCILIATION_REQUIRED, `CANCELLED_AFTER_WRITES`), or, for a RUNNING "
                        "execution, the cancel requested (`cancelRequested: true`).",
                    ),
                    **problems(
                        *WRITE_ERRORS,
                        "404",
                        "409",
                        s403="The token has neither scope, or only `requests:write` and the "
                        "request is someone else's.",
                        s409="`NOT_CANCELLABLE`: the execution has ended or is parked for a "
                        "decision.",
                    ),
                },
            },
        },
    }


# Each area of the API keeps its own paths and schemas beside its routes' concerns.
_AREAS = (
    agent,
    automation,
    bulk,
    machines,
    notices,
    approvals,
    rollouts,
    schedules,
    auth,
    quotas,
)


def _paths() -> dict[str, Any]:
    paths = _core_paths()
    for area in _AREAS:
        paths.update(area.paths())
    return paths


def _area_schemas() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for area in _AREAS:
        found.update(area.SCHEMAS)
    return found


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
        "security": SECURED,
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
            "schemas": {
                "CreateRequest": schemas.CREATE_REQUEST_BODY,
                "TransitionRequest": schemas.TRANSITION_BODY,
                "RunRequest": schemas.RUN_BODY,
                "RunStarted": schemas.RUN_STARTED,
                "FlowCreated": schemas.FLOW_CREATED,
                "Flow": schemas.FLOW,
                "Request": schemas.REQUEST,
                "TransitionAccepted": schemas.TRANSITION_ACCEPTED,
                "ExecutionView": schemas.EXECUTION,
                "ExecutionPage": schemas.EXECUTION_PAGE,
                "FlowVersions": schemas.FLOW_VERSIONS,
                "Capabilities": schemas.CAPABILITIES,
                "Evidence": schemas.EVIDENCE,
                "ReconciliationRequest": schemas.RECONCILIATION_BODY,
                "CancelRequest": schemas.CANCEL_BODY,
                "CancelledExecution": schemas.CANCELLED_EXECUTION,
                "Problem": schemas.PROBLEM,
                "Health": schemas.HEALTH,
                **_area_schemas(),
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
