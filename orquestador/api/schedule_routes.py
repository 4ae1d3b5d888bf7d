"""Schedules: put one whole, read it with where its firing stands, list, run now, delete."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_PLANS_ADMIN
from orquestador.api.context import api_context, engine
from orquestador.api.openapi.schedules import LIST_LIMIT, SCHEDULE_BODY
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.quota_checks import require_open_execution_room
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.automation.firing import run_now
from orquestador.automation.schedules import (
    FlowNotFound,
    Schedule,
    ScheduleSpec,
    delete_schedule,
    find_schedule,
    list_schedules,
    put_schedule,
    schedule_id_problem,
)
from orquestador.domain.schedule_times import (
    CATCH_UP_SKIP,
    Timing,
    pace_problem,
    timing_problems,
)
from orquestador.errors import Problem

blueprint = Blueprint("schedules", __name__, url_prefix=f"{API_PREFIX}/schedules")


def schedule_view(found: Schedule) -> dict[str, Any]:
    spec = found.spec
    when: dict[str, Any] = (
        {"cron": spec.timing.cron}
        if spec.timing.cron is not None
        else {"everySeconds": spec.timing.every_seconds}
    )
    return {
        "id": found.key,
        "flow": spec.flow,
        "flowId": str(found.flow_id),
        "flowKey": found.flow_key,
        "transition": spec.transition,
        **when,
        "timezone": spec.timing.timezone,
        "data": spec.data,
        "catchUp": spec.catch_up,
        "paused": spec.paused,
        "nextFireAt": timestamp(found.next_fire_at),
        "lastFiredAt": timestamp(found.last_fired_at),
        "missed": found.missed,
        "createdAt": timestamp(found.created_at),
        "updatedAt": timestamp(found.updated_at),
    }


def _known_schedule_id(schedule_id: str) -> str:
    # No schedule can have a malformed id: it is missing, like any other.
    if schedule_id_problem(schedule_id) is not None:
        raise not_found()
    return schedule_id


def _now() -> datetime:
    return datetime.now(UTC)


def _spec(body: dict[str, Any]) -> ScheduleSpec:
    if ("flow" in body) == ("flowId" in body):
        raise ApiProblem(
            422,
            "BODY_INVALID",
            "The request body does not match the schema.",
            problems=[
                Problem("/flow", "give the flow (a key or a version's id), or flowId, not both")
            ],
        )
    named = body["flow"] if "flow" in body else body["flowId"]
    cron, every = body.get("cron"), body.get("everySeconds")
    timezone = body.get("timezone", "UTC")
    problems = timing_problems(cron, every, timezone)
    if not problems:
        quotas = api_context().settings.quotas_for(current_caller().org)
        pace = pace_problem(Timing(cron, every, timezone), quotas.schedule_min_seconds, _now())
        if pace is not None:
            raise ApiProblem(
                422,
                "QUOTA_EXCEEDED",
                f"The organization's quota scheduleMinSeconds ({quotas.schedule_min_seconds})"
                " allows no schedule that fires this often.",
                problems=[pace],
            )
    if problems:
        raise ApiProblem(
            422,
            "SCHEDULE_INVALID",
            "The schedule's timing cannot be used.",
            problems=problems,
        )
    return ScheduleSpec(
        flow=named,
        timing=Timing(cron, every, timezone),
        data=body.get("data", {}),
        catch_up=body.get("catchUp", CATCH_UP_SKIP),
        paused=body.get("paused", False),
        transition=body.get("transition"),
    )


@blueprint.put("/<schedule_id>")
@requires_scope(SCOPE_PLANS_ADMIN)
def put(schedule_id: str) -> tuple[Response, int, dict[str, str]]:
    problem = schedule_id_problem(schedule_id)
    if problem is not None:
        raise ApiProblem(
            422,
            "SCHEDULE_ID_INVALID",
            "The schedule id cannot be used.",
            problems=[Problem("", problem)],
        )
    spec = _spec(read_json_object(SCHEDULE_BODY))
    caller = current_caller()
    with engine().begin() as connection:
        found, created = put_schedule(
            connection,
            org=caller.org,
            key=schedule_id,
            spec=spec,
            actor=caller.sub,
            max_schedules=api_context().settings.quotas_for(caller.org).schedules,
        )
    if created:
        location = f"{API_PREFIX}/schedules/{schedule_id}"
        return jsonify(schedule_view(found)), 201, {"Location": location}
    return jsonify(schedule_view(found)), 200, {}


@blueprint.get("/<schedule_id>")
@requires_scope(SCOPE_PLANS_ADMIN)
def read(schedule_id: str) -> Response:
    with engine().connect() as connection:
        found = find_schedule(
            connection, org=current_caller().org, key=_known_schedule_id(schedule_id)
        )
    if found is None:
        raise not_found()
    return jsonify(schedule_view(found))


@blueprint.get("")
@requires_scope(SCOPE_PLANS_ADMIN)
def listing() -> Response:
    with engine().connect() as connection:
        found = list_schedules(connection, org=current_caller().org, limit=LIST_LIMIT)
    return jsonify({"items": [schedule_view(s) for s in found]})


@blueprint.delete("/<schedule_id>")
@requires_scope(SCOPE_PLANS_ADMIN)
def delete(schedule_id: str) -> tuple[str, int]:
    with engine().begin() as connection:
        deleted = delete_schedule(
            connection, org=current_caller().org, key=_known_schedule_id(schedule_id)
        )
    if not deleted:
        raise not_found()
    return "", 204


@blueprint.post("/<schedule_id>/runs")
@requires_scope(SCOPE_PLANS_ADMIN)
def run(schedule_id: str) -> tuple[Response, int, dict[str, str]]:
    caller = current_caller()
    key = _known_schedule_id(schedule_id)
    require_open_execution_room(caller.org)
    try:
        with engine().begin() as connection:
            fired = run_now(
                connection,
                org=caller.org,
                key=key,
                actor=caller.sub,
                max_attempts=api_context().settings.execution_max_attempts,
            )
    except FlowNotFound:
        raise ApiProblem(
            422,
            "DATA_INVALID",
            "The schedule's flow no longer exists.",
            problems=[Problem("/flow", "no such flow in this organization")],
        ) from None
    if fired is None:
        raise not_found()
    return (
        jsonify(
            {
                "scheduleId": key,
                "fireTime": timestamp(fired.fire_time),
                "requestId": str(fired.request_id),
                "executionId": str(fired.execution_id),
            }
        ),
        201,
        {"Location": f"{API_PREFIX}/executions/{fired.execution_id}"},
    )
