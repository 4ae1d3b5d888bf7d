"""Platform events: POST /events starts the flow bound to (plan, moment) exactly once."""

from __future__ import annotations

from datetime import datetime

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_EVENTS_WRITE
from orquestador.api.context import api_context, engine
from orquestador.api.openapi.automation import EVENT_BODY
from orquestador.api.problems import ApiProblem
from orquestador.api.quota_checks import require_open_execution_room, require_transition_token
from orquestador.api.views import API_PREFIX
from orquestador.automation.events import Actor, PlatformEvent, receive_event
from orquestador.errors import Problem

blueprint = Blueprint("events", __name__, url_prefix=f"{API_PREFIX}/events")


def _occurred_at(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ApiProblem(
            422,
            "BODY_INVALID",
            "The body does not have the expected fields.",
            problems=[Problem("/occurredAt", "an RFC 3339 date-time with an offset")],
        )
    return moment


@blueprint.post("")
@requires_scope(SCOPE_EVENTS_WRITE)
def post() -> tuple[Response, int, dict[str, str]]:
    caller = current_caller()
    body = read_json_object(EVENT_BODY)
    event = PlatformEvent(
        org=caller.org,
        id=body["id"],
        moment=body["moment"],
        plan_id=body["planId"],
        machine_id=body["machineId"],
        occurred_at=_occurred_at(body.get("occurredAt")),
        data=body.get("data", {}),
    )
    require_transition_token(caller.org)
    require_open_execution_room(caller.org)
    answer = receive_event(
        engine(),
        event,
        Actor(caller.sub, caller.snapshot()),
        max_attempts=api_context().settings.execution_max_attempts,
    )
    if answer.started:
        location = f"{API_PREFIX}/executions/{answer.execution_id}"
        return jsonify(answer.body()), 202, {"Location": location}
    return jsonify(answer.body()), 200, {}
