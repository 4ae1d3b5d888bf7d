"""Platform events: POST /events starts the flow bound to (plan, moment) exactly once."""

from __future__ import annotations

import json
from datetime import datetime

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import SCOPE_EVENTS_WRITE, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.context import api_context, engine
from orquestador.api.openapi_automation import EVENT_BODY
from orquestador.api.problems import PROBLEM_MEDIA_TYPE, ApiProblem, problem_document
from orquestador.api.views import API_PREFIX
from orquestador.automation.events import Actor, EventAnswer, PlatformEvent, receive_event
from orquestador.domain.errors import Problem

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


def _reused(answer: EventAnswer) -> Response:
    """409 for an id reused with another body, with what the recorded event got.

    Answering the recorded event's outcome as if it were this one's would hide that
    this body was never processed; the sender still learns what its id stands for.
    """
    document = problem_document(
        409,
        "EVENT_ID_REUSED",
        "This event id was received before with a different body; the event recorded"
        " under it stands and this body was not kept. Send a new event under a new id.",
        problems=[
            Problem(f"/{name}", "differs from the recorded event") for name in answer.differs_in
        ],
    )
    document["recorded"] = answer.body()
    return Response(json.dumps(document), status=409, mimetype=PROBLEM_MEDIA_TYPE)


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
    answer = receive_event(
        engine(),
        event,
        Actor(caller.sub, caller.snapshot()),
        max_attempts=api_context().settings.execution_max_attempts,
    )
    if answer.differs_in:
        return _reused(answer), 409, {}
    if answer.started:
        location = f"{API_PREFIX}/executions/{answer.execution_id}"
        return jsonify(answer.body()), 202, {"Location": location}
    return jsonify(answer.body()), 200, {}
