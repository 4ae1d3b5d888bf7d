"""Flow administration: publish a definition as a new version, list versions, read one."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import Connection, Row, select

from orquestador.api.action_contracts import contract_lookup
from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object, unstorable_text
from orquestador.api.capability_routes import app_adapters
from orquestador.api.claims import SCOPE_FLOWS_ADMIN
from orquestador.api.context import api_context, engine
from orquestador.api.flow_store import MAX_KEY_CHARACTERS, flow_by_reference, publish_flow
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, flow_created_view, flow_version_view, flow_view
from orquestador.db.schema import flow
from orquestador.domain.flow_definition import FlowDefinition, validate_definition
from orquestador.domain.reachability import unreachable
from orquestador.errors import Problem

blueprint = Blueprint("flows", __name__, url_prefix=f"{API_PREFIX}/flows")


@blueprint.post("")
@requires_scope(SCOPE_FLOWS_ADMIN)
def publish() -> tuple[Response, int, dict[str, str]]:
    caller = current_caller()
    # The definition's own JSON Schema owns its shape, unknown fields included.
    definition = read_json_object()
    context = api_context()
    errors, warnings = validate_definition(
        definition,
        context.capability_problem,
        contract_lookup(context.settings, app_adapters(), org=caller.org),
    )
    if errors:
        raise ApiProblem(
            422, "FLOW_INVALID", "The flow definition cannot be published.", problems=errors
        )
    # Lint's findings about paths are warnings here: a state only an operator's
    # reconciliation reaches is allowed, and said.
    warnings += unreachable(definition)
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


@blueprint.get("")
@requires_scope(SCOPE_FLOWS_ADMIN)
def listing() -> Response:
    key = request.args.get("key")
    if key is not None and (not key or len(key) > MAX_KEY_CHARACTERS or unstorable_text(key)):
        raise ApiProblem(
            400,
            "QUERY_INVALID",
            "A query parameter is invalid.",
            problems=[Problem("/key", f"a flow key of 1 to {MAX_KEY_CHARACTERS} characters")],
        )
    with engine().connect() as connection:
        rows = flow_versions(connection, org=current_caller().org, key=key)
    return jsonify({"items": [flow_version_view(row) for row in rows]})


def flow_versions(connection: Connection, *, org: str, key: str | None) -> list[Row]:
    """Every version of the organization's flows (of one key), by key, newest version first."""
    query = select(flow.c.id, flow.c.key, flow.c.version, flow.c.trigger, flow.c.created_at).where(
        flow.c.org_id == org
    )
    if key is not None:
        query = query.where(flow.c.key == key)
    return list(connection.execute(query.order_by(flow.c.key, flow.c.version.desc())))


@blueprint.get("/<flow_id>")
@requires_scope(SCOPE_FLOWS_ADMIN)
def read(flow_id: str) -> Response:
    """A version by its id, or a key's latest version."""
    with engine().connect() as connection:
        row = flow_by_reference(connection, org=current_caller().org, reference=flow_id)
    if row is None:
        raise not_found()
    return jsonify(flow_view(row))
