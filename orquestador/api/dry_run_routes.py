"""Dry runs: a simulated request and execution that cannot touch the world."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.actions.rehearsals import outcome_problems
from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_FLOWS_ADMIN
from orquestador.api.context import api_context, engine
from orquestador.api.flow_store import flow_by_reference
from orquestador.api.openapi.automation import DRY_RUN_BODY
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.quota_checks import require_open_execution_room
from orquestador.api.request_routes import check_request_data
from orquestador.api.views import API_PREFIX
from orquestador.domain.continuations import followed_by
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.errors import Problem
from orquestador.queue.acceptance import insert_request, queue_execution

blueprint = Blueprint("dry_runs", __name__, url_prefix=f"{API_PREFIX}/flows")


@blueprint.post("/<flow_id>/dry-runs")
@requires_scope(SCOPE_FLOWS_ADMIN)
def start(flow_id: str) -> tuple[Response, int, dict[str, str]]:
    execution_id, request_id = start_dry_run(
        current_caller(), flow_id, read_json_object(DRY_RUN_BODY)
    )
    answer = {"executionId": str(execution_id), "requestId": str(request_id), "simulation": True}
    return jsonify(answer), 202, {"Location": f"{API_PREFIX}/executions/{execution_id}"}


def start_dry_run(
    caller: Caller, flow: str | uuid.UUID, body: dict[str, Any]
) -> tuple[uuid.UUID, uuid.UUID]:
    """Start a dry run for `caller` (the API's and the pages' one way): (execution, request).

    `flow` is a flow version's id, or a key (its latest version). `body` has
    DRY_RUN_BODY's shape already; what the flow itself rules out is a 422. A dry run's
    execution counts against the quota openExecutions like any other until it ends.
    """
    require_open_execution_room(caller.org)
    with engine().begin() as connection:
        flow = flow_by_reference(connection, org=caller.org, reference=str(flow))
        if flow is None:
            raise not_found()
        definition = FlowDefinition.from_json(flow.definition)
        state = body.get("state", definition.initial_state)
        _check_state_and_transition(definition, state, body["transition"])
        outcomes = body.get("outcomes") or None
        _check_outcomes(definition, body["transition"], outcomes or {})
        check_request_data(body["data"], flow.data_schema)
        created = insert_request(
            connection,
            org=caller.org,
            owner=caller.sub,
            flow_row=flow,
            data=body["data"],
            machine_id=_machine_id(body["data"]),
            state=state,
            simulation=True,
        )
        execution_id = queue_execution(
            connection,
            request_row=created,
            definition=definition,
            transition_id=body["transition"],
            actor=caller.sub,
            actor_snapshot=caller.snapshot(),
            max_attempts=api_context().settings.execution_max_attempts,
            simulation=True,
            rehearsal=outcomes,
        )
    return execution_id, created.id


def _check_state_and_transition(definition: FlowDefinition, state: str, transition: str) -> None:
    if state not in definition.states:
        raise ApiProblem(
            422,
            "STATE_UNKNOWN",
            "The flow has no such state.",
            problems=[Problem("/state", f"unknown state {state!r}")],
        )
    chosen = definition.transitions.get(transition)
    if chosen is None:
        raise ApiProblem(
            422,
            "TRANSITION_UNKNOWN",
            "The flow has no such transition.",
            problems=[Problem("/transition", "unknown transition id")],
        )
    if not chosen.leaves(state):
        raise ApiProblem(
            422,
            "TRANSITION_NOT_ALLOWED",
            f"The transition does not leave the state {state!r}.",
            problems=[Problem("/transition", f"does not leave state {state!r}")],
        )


def _check_outcomes(definition: FlowDefinition, transition: str, outcomes: dict[str, Any]) -> None:
    # The dry run follows its continuations: their steps may be rehearsed too (an action
    # id names the same answer in each transition that has it).
    actions = {
        action.id: action.capability
        for name in (transition, *followed_by(definition.raw, transition))
        for action in definition.transitions[name].actions
    }
    problems = outcome_problems(outcomes, actions)
    if problems:
        raise ApiProblem(
            422,
            "OUTCOMES_INVALID",
            "An outcome names no action of the transition, or one its step cannot give.",
            problems=problems,
        )


def _machine_id(data: dict[str, object]) -> str | None:
    # A moment flow's data names its machine; the simulated request says so too, as the
    # real one would, so a page or a simulated step reading the request finds it.
    machine = data.get("machineId")
    return machine if isinstance(machine, str) and 0 < len(machine) <= 200 else None
