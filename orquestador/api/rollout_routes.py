"""A rollout's routes: read it, pause, resume and cancel it, retry its failed children.

A rollout is named by its parent execution (`/executions/{id}/rollout`). Reading needs
what reading the execution needs; pause, resume and cancel what cancelling it needs
(`executions:cancel`, or `requests:write` on one's own request); retrying the failed
children what reconciling needs (`executions:reconcile`). Each change is audited on the
parent execution and answered with the rollout as it is now.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.access import Reach, ResourceAccess
from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import (
    SCOPE_EXECUTIONS_CANCEL,
    SCOPE_EXECUTIONS_RECONCILE,
    SCOPE_REQUESTS_READ,
    SCOPE_REQUESTS_WRITE,
)
from orquestador.api.context import api_context, engine
from orquestador.api.execution_routes import require_visible
from orquestador.api.problems import not_found
from orquestador.api.quota_checks import require_open_execution_room
from orquestador.api.views import API_PREFIX
from orquestador.rollouts.control import (
    cancel_rollout,
    mark,
    retry_failed,
)
from orquestador.rollouts.reading import latest_rollout, rollout_children, rollout_view

blueprint = Blueprint("rollouts", __name__, url_prefix=f"{API_PREFIX}/executions")

REASON = {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": "^[^\\x00]*$"}
MARK_BODY: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": REASON},
}
CANCEL_ROLLOUT_BODY: dict[str, Any] = {**MARK_BODY, "required": ["reason"]}
# The problems' statuses, by code.


@blueprint.get("/<uuid:execution_id>/rollout")
@requires_scope(SCOPE_REQUESTS_READ)
def read(execution_id: uuid.UUID) -> Response:
    return jsonify(read_rollout(current_caller(), execution_id, children=True))


def read_rollout(
    caller: Caller,
    execution_id: uuid.UUID,
    *,
    children: bool = False,
    access: ResourceAccess | None = None,
) -> dict[str, Any]:
    """The rollout of an execution `access` (else the caller's reading) reaches; 404
    otherwise, or without one."""
    access = access or ResourceAccess(caller)
    with engine().connect() as connection:
        if access.find_execution(connection, execution_id) is None:
            raise not_found()
        row = latest_rollout(connection, org=caller.org, execution_id=execution_id)
        if row is None:
            raise not_found()
        view = rollout_view(row)
        if children:
            view["children"] = rollout_children(connection, row)
    return view


@blueprint.post("/<uuid:execution_id>/rollout/pause")
@requires_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE)
def pause(execution_id: uuid.UUID) -> Response:
    body = read_json_object(MARK_BODY)
    return jsonify(mark_as(current_caller(), execution_id, "pause", body.get("reason", "")))


@blueprint.post("/<uuid:execution_id>/rollout/resume")
@requires_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE)
def resume(execution_id: uuid.UUID) -> Response:
    body = read_json_object(MARK_BODY)
    return jsonify(mark_as(current_caller(), execution_id, "resume", body.get("reason", "")))


@blueprint.post("/<uuid:execution_id>/rollout/cancel")
@requires_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE)
def cancel(execution_id: uuid.UUID) -> Response:
    body = read_json_object(CANCEL_ROLLOUT_BODY)
    return jsonify(mark_as(current_caller(), execution_id, "cancel", body["reason"]))


@blueprint.post("/<uuid:execution_id>/rollout/retry-failed")
@requires_scope(SCOPE_EXECUTIONS_RECONCILE)
def retry(execution_id: uuid.UUID) -> tuple[Response, int, dict[str, str]]:
    read_json_object(MARK_BODY)
    retried = retry_as(current_caller(), execution_id)
    location = f"{API_PREFIX}/executions/{retried['executionId']}"
    return jsonify(retried), 202, {"Location": location}


def mark_as(caller: Caller, execution_id: uuid.UUID, what: str, reason: str) -> dict[str, Any]:
    """Pause, resume or cancel for `caller` (the API's and the pages' one way)."""
    operator = caller.has_scope(SCOPE_EXECUTIONS_CANCEL)
    access = ResourceAccess(caller, Reach.ORGANIZATION if operator else Reach.OWN)
    require_visible(access, execution_id, readable_by=None if operator else caller)
    reason = reason or f"{what} by {caller.sub}"
    if what == "cancel":
        cancelled = cancel_rollout(
            engine(), execution_id=execution_id, org=caller.org, actor=caller.sub, reason=reason
        )
        view = read_rollout(caller, execution_id, access=access)
        return {**view, "cancelledChildren": cancelled.children}
    with engine().connect() as connection:
        mark(
            connection,
            what=what,
            execution_id=execution_id,
            org=caller.org,
            actor=caller.sub,
            reason=reason,
        )
    return read_rollout(caller, execution_id, access=access)


def retry_as(caller: Caller, execution_id: uuid.UUID) -> dict[str, Any]:
    """Retry the failed children for `caller`: a new run over just them."""
    access = ResourceAccess(caller, Reach.ORGANIZATION)
    require_visible(access, execution_id)
    # A new parent execution: held to the quota like any start.
    require_open_execution_room(caller.org)
    with engine().connect() as connection:
        retried = retry_failed(
            connection,
            execution_id=execution_id,
            org=caller.org,
            actor=caller.sub,
            actor_snapshot=caller.snapshot(),
            max_attempts=api_context().settings.execution_max_attempts,
        )
    return retried.as_json()
