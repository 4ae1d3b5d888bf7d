"""Runs: a real request created and its first transition accepted in one call.

`POST /runs {flow, transition, data, priority?, machineId?}` does what creating a
request and asking for its first transition do, in one transaction and with the same
checks, scope and problems: the flow of the caller's organization (a key names its
latest version), the transition leaving the flow's initial state, the data against the
flow's data schema, the concurrency key the transition reads. Nothing is written unless
everything is accepted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_REQUESTS_WRITE
from orquestador.api.context import api_context, engine
from orquestador.api.flow_store import flow_by_reference
from orquestador.api.problems import ApiProblem
from orquestador.api.quota_checks import require_open_execution_room, require_transition_token
from orquestador.api.request_routes import check_request_data
from orquestador.api.schemas import RUN_BODY
from orquestador.api.views import API_PREFIX
from orquestador.domain.concurrency import KeyMissing
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.errors import Problem
from orquestador.queue import acceptance
from orquestador.queue.acceptance import insert_request, queue_execution

blueprint = Blueprint("runs", __name__, url_prefix=f"{API_PREFIX}/runs")


@dataclass(frozen=True)
class RunStarted:
    """What a started run answers: the new request, its execution, the flow version."""

    request_id: uuid.UUID
    execution_id: uuid.UUID
    flow_id: uuid.UUID
    flow_key: str
    flow_version: int

    def as_json(self) -> dict[str, Any]:
        return {
            "requestId": str(self.request_id),
            "executionId": str(self.execution_id),
            "flowId": str(self.flow_id),
            "flowKey": self.flow_key,
            "flowVersion": self.flow_version,
        }


@blueprint.post("")
@requires_scope(SCOPE_REQUESTS_WRITE)
def start() -> tuple[Response, int, dict[str, str]]:
    started = start_run(current_caller(), read_json_object(RUN_BODY))
    location = f"{API_PREFIX}/executions/{started.execution_id}"
    return jsonify(started.as_json()), 202, {"Location": location}


def start_run(caller: Caller, body: dict[str, Any]) -> RunStarted:
    """Start a real run for `caller` (the API's and the pages' one way).

    `body` has RUN_BODY's shape already; what the flow rules out is a 422 problem whose
    paths point into the body (`/flow`, `/transition`, `/data/...`).
    """
    require_transition_token(caller.org)
    require_open_execution_room(caller.org)
    with engine().begin() as connection:
        flow = flow_by_reference(connection, org=caller.org, reference=body["flow"])
        if flow is None:
            raise ApiProblem(
                422,
                "FLOW_UNKNOWN",
                "No flow with this key or id in your organization.",
                problems=[Problem("/flow", "no flow with this key or id in your organization")],
            )
        definition = FlowDefinition.from_json(flow.definition)
        _check_transition(definition, body["transition"])
        check_request_data(body["data"], flow.data_schema)
        created = insert_request(
            connection,
            org=caller.org,
            owner=caller.sub,
            flow_row=flow,
            data=body["data"],
            machine_id=body.get("machineId"),
        )
        try:
            execution_id = queue_execution(
                connection,
                request_row=created,
                definition=definition,
                transition_id=body["transition"],
                actor=caller.sub,
                actor_snapshot=caller.snapshot(),
                max_attempts=api_context().settings.execution_max_attempts,
                priority=body.get("priority"),
            )
        except KeyMissing as missing:
            # Raised before anything of the execution is written; the transaction, the
            # request with it, rolls back. The key's pointer (/data/...) points into the
            # body as it stands.
            raise acceptance.TransitionRefused(
                acceptance.CONCURRENCY_KEY_MISSING,
                "The transition declares a concurrency key that the request data does not give.",
                [missing.problem],
            ) from None
    return RunStarted(created.id, execution_id, flow.id, flow.key, flow.version)


def _check_transition(definition: FlowDefinition, transition_id: str) -> None:
    """The same refusals as asking a new request for the transition (api/transitions.py)."""
    transition = definition.transitions.get(transition_id)
    if transition is None:
        raise _refused(
            acceptance.TRANSITION_UNKNOWN,
            "The flow has no such transition.",
            Problem("/transition", "unknown transition id"),
        )
    if not transition.leaves(definition.initial_state):
        raise _refused(
            acceptance.TRANSITION_NOT_ALLOWED,
            f"The transition does not leave the flow's initial state {definition.initial_state!r}.",
            Problem("/transition", f"does not leave state {definition.initial_state!r}"),
        )


def _refused(code: str, message: str, problem: Problem) -> acceptance.TransitionRefused:
    return acceptance.TransitionRefused(code, message, [problem])
