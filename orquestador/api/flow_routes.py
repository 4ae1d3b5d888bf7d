"""Flow administration: publish a definition as a new version, read one back."""

from __future__ import annotations

import uuid

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import SCOPE_FLOWS_ADMIN, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.context import api_context, engine
from orquestador.api.flow_store import find_flow, publish_flow
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, flow_created_view, flow_view
from orquestador.domain.flow_definition import FlowDefinition, validate_definition

blueprint = Blueprint("flows", __name__, url_prefix=f"{API_PREFIX}/flows")


@blueprint.post("")
@requires_scope(SCOPE_FLOWS_ADMIN)
def publish() -> tuple[Response, int, dict[str, str]]:
    caller = current_caller()
    # The definition's own JSON Schema owns its shape, unknown fields included.
    definition = read_json_object()
    errors, warnings = validate_definition(definition, api_context().capability_problem)
    if errors:
        raise ApiProblem(
            422, "FLOW_INVALID", "The flow definition cannot be published.", problems=errors
        )
    parsed = FlowDefinition.from_json(definition)
    with engine().begin() as connection:
        row = publish_flow(
            connection,
            org=caller.org,
            key=parsed.key,
            trigger=parsed.trigger,
            definition=definition,
            data_schema=parsed.data_schema,
            created_by=caller.sub,
        )
    body = flow_created_view(row, [w.as_dict() for w in warnings])
    return jsonify(body), 201, {"Location": f"{API_PREFIX}/flows/{row.id}"}


@blueprint.get("/<uuid:flow_id>")
@requires_scope(SCOPE_FLOWS_ADMIN)
def read(flow_id: uuid.UUID) -> Response:
    with engine().connect() as connection:
        row = find_flow(connection, org=current_caller().org, flow_id=flow_id)
    if row is None:
        raise not_found()
    return jsonify(flow_view(row))
