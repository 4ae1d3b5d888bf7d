"""Bulk actions by query: POST /executions/bulk (a preview, or a bulk accepted), GET /bulk/{id}."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.access import BulkFilter, Reach, ResourceAccess
from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.bulk_schemas import BULK_BODY
from orquestador.api.claims import SCOPE_EXECUTIONS_CANCEL, SCOPE_EXECUTIONS_RECONCILE
from orquestador.api.context import api_context, engine
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.domain.statuses import BulkStatus
from orquestador.errors import Problem
from orquestador.queue.bulk import BulkProgress, BulkRequest, accept_bulk, bulk_progress

log = logging.getLogger(__name__)

blueprint = Blueprint("bulk", __name__, url_prefix=API_PREFIX)

# The scope each action needs: what the same action on one execution needs of an operator.
ACTION_SCOPES = {
    "cancel": SCOPE_EXECUTIONS_CANCEL,
    "retry": SCOPE_EXECUTIONS_RECONCILE,
    "fail": SCOPE_EXECUTIONS_RECONCILE,
}
SAMPLE_SIZE = 10


# A bulk action's own scope is checked per action (`_access_for`); reaching the routes
# needs any one of them.
_ANY_BULK_SCOPE = tuple(sorted(set(ACTION_SCOPES.values())))


@blueprint.post("/executions/bulk")
@requires_scope(*_ANY_BULK_SCOPE)
def start() -> tuple[Response, int] | Response:
    caller = current_caller()
    body = read_json_object(BULK_BODY)
    if body.get("preview", False):
        return jsonify(preview_as(caller, body["action"], body["filter"]))
    bulk_id, total = start_as(caller, body)
    answer = jsonify(
        {
            "bulkId": str(bulk_id),
            "status": BulkStatus.DONE if total == 0 else BulkStatus.RUNNING,
            "total": total,
        }
    )
    answer.headers["Location"] = f"{API_PREFIX}/bulk/{bulk_id}"
    return answer, 202


def _access_for(caller: Caller, action: str) -> ResourceAccess:
    scope = ACTION_SCOPES[action]
    if not caller.has_scope(scope):
        raise ApiProblem(403, "INSUFFICIENT_SCOPE", f"A bulk {action} needs the {scope} scope.")
    # Operators act on the whole organization, as on one execution with the same scope.
    return ResourceAccess(caller, Reach.ORGANIZATION)


def preview_as(caller: Caller, action: str, criteria: dict[str, Any]) -> dict[str, Any]:
    """How many executions a bulk `action` would take, and a sample (nothing recorded)."""
    return _preview(_access_for(caller, action), action, bulk_filter(criteria))


def start_as(caller: Caller, body: dict[str, Any]) -> tuple[uuid.UUID, int]:
    """Accept a bulk action (a body of BULK_BODY's shape) for `caller`: (its id, total).

    The API's and the pages' one way in; 422 BULK_TOO_LARGE beyond the organization's
    quota bulkItems.
    """
    action = body["action"]
    access = _access_for(caller, action)
    found = bulk_filter(body["filter"])
    bulk = BulkRequest(
        org_id=caller.org,
        actor=caller.sub,
        action=action,
        reason=body["reason"],
        filter=body["filter"],
    )
    max_items = api_context().settings.quotas_for(caller.org).bulk_items
    with engine().begin() as connection:
        bulk_id, total = accept_bulk(
            connection, bulk, access.bulk_matches(found), max_items=max_items
        )
    if bulk_id is None:
        raise ApiProblem(
            422,
            "BULK_TOO_LARGE",
            f"The filter matches {total} executions; a bulk action takes at most {max_items} "
            "(the organization's quota bulkItems).",
            problems=[Problem("/filter", "narrow it (createdAfter, createdBefore, flowId, ...)")],
        )
    log.info(
        "bulk action accepted: %s of %d executions",
        action,
        total,
        extra={"bulk_id": str(bulk_id), "action": action, "total": total},
    )
    return bulk_id, total


@blueprint.get("/bulk/<uuid:bulk_id>")
@requires_scope(*_ANY_BULK_SCOPE)
def progress(bulk_id: uuid.UUID) -> Response:
    found = read_progress(current_caller(), bulk_id)
    if found is None:
        raise not_found()
    return jsonify(progress_view(found))


def read_progress(caller: Caller, bulk_id: uuid.UUID) -> BulkProgress | None:
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            return bulk_progress(connection, bulk_id, caller.org)


def _preview(access: ResourceAccess, action: str, found: BulkFilter) -> dict[str, Any]:
    cancel = action == "cancel"
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            count, parking, sample = access.bulk_preview(
                connection, found, SAMPLE_SIZE, cancel=cancel
            )
    preview: dict[str, Any] = {
        "action": action,
        "count": count,
        "sample": [
            {
                "id": str(row.id),
                "requestId": str(row.request_id),
                "status": row.status,
                "errorCode": row.error_code,
                "flowKey": row.flow_key,
                "flowVersion": row.flow_version,
                "machineId": row.machine_id,
                "createdAt": timestamp(row.created_at),
                **({"parks": bool(row.parks)} if cancel else {}),
            }
            for row in sample
        ],
    }
    if cancel:
        preview["parks"] = parking
    return preview


def progress_view(found: BulkProgress) -> dict[str, Any]:
    return {
        "id": str(found.id),
        "action": found.action,
        "actor": found.actor,
        "reason": found.reason,
        "filter": found.filter,
        "status": found.status,
        "total": found.total,
        "done": found.done,
        "succeeded": found.succeeded,
        "parked": [
            {"executionId": str(item.execution_id), "code": item.code, "detail": item.detail}
            for item in found.parked
        ],
        "refused": [
            {"executionId": str(item.execution_id), "code": item.code, "detail": item.detail}
            for item in found.refused
        ],
        "cancelRequested": [str(execution_id) for execution_id in found.cancel_requested],
        "createdAt": timestamp(found.created_at),
        "finishedAt": timestamp(found.finished_at),
    }


def bulk_filter(body: dict[str, Any]) -> BulkFilter:
    """The filter of a body whose shape was checked; 422 for an id or instant that is not one."""
    problems: list[Problem] = []

    def instant(name: str) -> datetime | None:
        text = body.get(name)
        if text is None:
            return None
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            value = None
        if value is None or value.tzinfo is None:
            problems.append(
                Problem(f"/filter/{name}", "an RFC 3339 date-time with its offset (or Z)")
            )
            return None
        return value

    flow_id = None
    if body.get("flowId") is not None:
        try:
            flow_id = uuid.UUID(body["flowId"])
        except ValueError:
            problems.append(Problem("/filter/flowId", "a UUID"))
    found = BulkFilter(
        status=body.get("status"),
        flow_id=flow_id,
        flow_key=body.get("flowKey"),
        error_code=body.get("errorCode"),
        machine_id=body.get("machineId"),
        created_after=instant("createdAfter"),
        created_before=instant("createdBefore"),
    )
    if problems:
        raise ApiProblem(
            422, "BODY_INVALID", "The filter has values it cannot use.", problems=problems
        )
    return found
