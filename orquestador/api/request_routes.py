"""Requests: create one on a flow, read it, and ask for a transition."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.access import ResourceAccess
from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_REQUESTS_READ, SCOPE_REQUESTS_WRITE
from orquestador.api.context import api_context, engine
from orquestador.api.flow_store import flow_by_reference
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.schemas import CREATE_REQUEST_BODY, TRANSITION_BODY
from orquestador.api.transitions import accept_transition
from orquestador.api.views import API_PREFIX, request_view
from orquestador.domain.errors import DataSchemaError, DataValidationError
from orquestador.domain.limits import MAX_DATA_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.errors import Problem
from orquestador.queue.acceptance import TransitionCommand, insert_request

blueprint = Blueprint("requests", __name__, url_prefix=f"{API_PREFIX}/requests")


def _unknown_flow() -> ApiProblem:
    return ApiProblem(
        422,
        "FLOW_UNKNOWN",
        "No such flow in your organization.",
        problems=[Problem("/flowId", "no such flow in your organization")],
    )


@blueprint.post("")
@requires_scope(SCOPE_REQUESTS_WRITE)
def create() -> tuple[Response, int, dict[str, str]]:
    caller = current_caller()
    body = read_json_object(CREATE_REQUEST_BODY)
    with engine().begin() as connection:
        # A version's id, or a key: the request starts on its latest version.
        flow = flow_by_reference(connection, org=caller.org, reference=body["flowId"])
        if flow is None:
            raise _unknown_flow()
        check_request_data(body["data"], flow.data_schema)
        row = insert_request(
            connection,
            org=caller.org,
            owner=caller.sub,
            flow_row=flow,
            data=body["data"],
            machine_id=body.get("machineId"),
        )
    return jsonify(request_view(row)), 201, {"Location": f"{API_PREFIX}/requests/{row.id}"}


def check_request_data(data: Any, data_schema: dict[str, Any], at: str = "/data") -> None:
    """Raise the 422 problem when the data breaks the flow's data schema or size limit.

    Problem paths point into the body, where the data sits under `at`.
    """
    try:
        # Size and depth are checked first, then the flow's schema, then the data.
        validate_request_data(data, data_schema, max_bytes=MAX_DATA_BYTES)
    except DataSchemaError as exc:
        # A flow stored before publishing checked what it checks now: its problems
        # are in the flow's definition, at their paths there, not in the data.
        raise ApiProblem(
            422,
            exc.code,
            "The flow's data schema cannot be used; publish a version that fixes it.",
            problems=exc.problems,
        ) from None
    except DataValidationError as exc:
        problems = [Problem(f"{at}{p.path}", p.message) for p in exc.problems]
        raise ApiProblem(
            422,
            exc.code,
            "The data does not satisfy the flow's data schema.",
            problems=problems,
        ) from None


@blueprint.get("/<uuid:request_id>")
@requires_scope(SCOPE_REQUESTS_READ)
def read(request_id: uuid.UUID) -> Response:
    access = ResourceAccess(current_caller())
    with engine().connect() as connection:
        row = access.find_request(connection, request_id)
    if row is None:
        raise not_found()
    return jsonify(
        request_view(row, execution_id=row.execution_id, busy_execution_id=row.busy_execution_id)
    )


@blueprint.post("/<uuid:request_id>/transitions")
@requires_scope(SCOPE_REQUESTS_WRITE)
def transition(request_id: uuid.UUID) -> tuple[Response, int, dict[str, str]]:
    body = read_json_object(TRANSITION_BODY)
    if body.get("simulation", False):
        # Refused before the request is looked up: nothing moves, and the answer
        # says nothing about whether the request exists.
        raise ApiProblem(
            422,
            "SIMULATION_NOT_AVAILABLE",
            "A request's transition always runs for real; a dry run starts from the "
            'flow (POST /flows/{flowId}/dry-runs). Leave out "simulation".',
            problems=[
                Problem("/simulation", "dry runs start from the flow: POST /flows/{id}/dry-runs")
            ],
        )
    command = TransitionCommand(
        request_id=request_id,
        transition_id=body["transition"],
        expected_revision=int(body["expectedRevision"]),
        priority=body.get("priority"),
    )
    context = api_context()
    execution_id = accept_transition(
        engine(),
        ResourceAccess(current_caller()),
        command,
        max_attempts=context.settings.execution_max_attempts,
    )
    location = f"{API_PREFIX}/executions/{execution_id}"
    return jsonify({"executionId": str(execution_id)}), 202, {"Location": location}
