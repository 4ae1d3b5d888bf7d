"""Plans and their flow bindings per moment."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_PLANS_ADMIN
from orquestador.api.context import engine
from orquestador.api.flow_store import flow_by_reference
from orquestador.api.openapi.automation import BINDING_BODY, PLAN_BODY
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX
from orquestador.automation.plans import (
    Plan,
    bind_flow,
    find_plan,
    plan_id_problem,
    put_plan,
    unbind_flow,
)
from orquestador.db.schema import MOMENTS
from orquestador.errors import Problem

blueprint = Blueprint("plans", __name__, url_prefix=f"{API_PREFIX}/plans")


def plan_view(plan: Plan) -> dict[str, Any]:
    return {
        "id": plan.key,
        "name": plan.name,
        "bindings": {
            moment: None if flow_id is None else str(flow_id)
            for moment, flow_id in plan.bindings.items()
        },
    }


def _known_plan_id(plan_id: str) -> str:
    # No plan can have a malformed id: it is missing, like any other.
    if plan_id_problem(plan_id) is not None:
        raise not_found()
    return plan_id


def _known_moment(moment: str) -> str:
    if moment not in MOMENTS:
        raise not_found()
    return moment


@blueprint.put("/<plan_id>")
@requires_scope(SCOPE_PLANS_ADMIN)
def put(plan_id: str) -> tuple[Response, int, dict[str, str]]:
    problem = plan_id_problem(plan_id)
    if problem is not None:
        raise ApiProblem(
            422, "PLAN_ID_INVALID", "The plan id cannot be used.", problems=[Problem("", problem)]
        )
    body = read_json_object(PLAN_BODY)
    org = current_caller().org
    with engine().begin() as connection:
        created = put_plan(connection, org=org, key=plan_id, name=body["name"])
        plan = find_plan(connection, org=org, key=plan_id)
    assert plan is not None  # written in this transaction
    if created:
        return jsonify(plan_view(plan)), 201, {"Location": f"{API_PREFIX}/plans/{plan_id}"}
    return jsonify(plan_view(plan)), 200, {}


@blueprint.get("/<plan_id>")
@requires_scope(SCOPE_PLANS_ADMIN)
def read(plan_id: str) -> Response:
    with engine().connect() as connection:
        plan = find_plan(connection, org=current_caller().org, key=_known_plan_id(plan_id))
    if plan is None:
        raise not_found()
    return jsonify(plan_view(plan))


@blueprint.put("/<plan_id>/bindings/<moment>")
@requires_scope(SCOPE_PLANS_ADMIN)
def bind(plan_id: str, moment: str) -> Response:
    key, moment = _known_plan_id(plan_id), _known_moment(moment)
    body = read_json_object(BINDING_BODY)
    org = current_caller().org
    # A TriggerMismatch rolls the transaction back: the plan's bindings are as they were.
    with engine().begin() as connection:
        # A version's id, or a key: its latest version now (a later one is not followed).
        flow = flow_by_reference(connection, org=org, reference=body["flowId"])
        if flow is None:
            raise not_found()
        if not bind_flow(connection, org=org, key=key, moment=moment, flow_id=flow.id):
            raise not_found()
        plan = find_plan(connection, org=org, key=key)
    assert plan is not None
    return jsonify(plan_view(plan))


@blueprint.delete("/<plan_id>/bindings/<moment>")
@requires_scope(SCOPE_PLANS_ADMIN)
def unbind(plan_id: str, moment: str) -> tuple[str, int]:
    key, moment = _known_plan_id(plan_id), _known_moment(moment)
    with engine().begin() as connection:
        if not unbind_flow(connection, org=current_caller().org, key=key, moment=moment):
            raise not_found()
    return "", 204
