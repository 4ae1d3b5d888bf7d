"""Bulk actions from the pages: choose the executions by filter, see the preview (how
many, a sample), give a reason, then follow the worker's progress.

The filter uses the API's names (status, flowId, flowKey, errorCode, machineId,
createdAfter, createdBefore) and the same checks; starting goes through the same function as
`POST /executions/bulk`, so each item is still acted on under the normal rules.
"""

from __future__ import annotations

from typing import Any

from flask import Response, g, redirect, render_template, request, url_for

from orquestador.api.body import checked_object
from orquestador.api.bulk_routes import (
    ACTION_SCOPES,
    preview_as,
    progress_view,
    read_progress,
    start_as,
)
from orquestador.api.bulk_schemas import BULK_BODY, BULK_FILTER
from orquestador.api.pages.routes import (
    blueprint,
    not_found_page,
    page_action,
    page_id,
    require_page_scope,
    signed_in,
)
from orquestador.api.problems import ApiProblem
from orquestador.db.schema import EXECUTION_STATUSES

CRITERIA = tuple(BULK_FILTER["properties"])
REFRESH_SECONDS = 2


def _criteria(source: Any) -> dict[str, str]:
    return {name: source[name].strip() for name in CRITERIA if source.get(name, "").strip()}


def _require_bulk_scope() -> None:
    require_page_scope(*sorted(set(ACTION_SCOPES.values())), what="bulk actions")


@blueprint.get("/bulk")
@signed_in
def bulk_preview() -> Any:
    _require_bulk_scope()
    criteria = _criteria(request.args)
    actions = [action for action, scope in ACTION_SCOPES.items() if g.caller.has_scope(scope)]
    action = request.args.get("action") or actions[0]
    if action not in actions:
        raise ApiProblem(422, "FORM_INVALID", f"Choose one of: {', '.join(actions)}.")
    preview = None
    if criteria:
        preview = preview_as(g.caller, action, checked_object(criteria, BULK_FILTER))
    return render_template(
        "bulk_preview.html",
        caller=g.caller,
        criteria=criteria,
        statuses=EXECUTION_STATUSES,
        actions=actions,
        action=action,
        preview=preview,
    )


@blueprint.post("/bulk")
@page_action
def start_bulk() -> Any:
    _require_bulk_scope()
    body = {
        "filter": _criteria(request.form),
        "action": request.form.get("action", ""),
        "reason": request.form.get("reason", "").strip(),
    }
    bulk_id, _ = start_as(g.caller, checked_object(body, BULK_BODY))
    return redirect(url_for("ui.bulk_page", bulk_id=str(bulk_id)), 303)


@blueprint.get("/bulk/<bulk_id>")
@signed_in
def bulk_page(bulk_id: str) -> Any:
    _require_bulk_scope()
    found = read_progress(g.caller, page_id(bulk_id))
    if found is None:
        raise not_found_page()
    view = progress_view(found)
    answer = Response(
        render_template("bulk.html", caller=g.caller, bulk=view), mimetype="text/html"
    )
    if view["status"] != "DONE":
        answer.headers["Refresh"] = str(REFRESH_SECONDS)  # follows the worker by itself
    return answer
