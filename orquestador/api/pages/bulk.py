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
from orquestador.api.pages.forms import CSRF_FIELD
from orquestador.api.pages.routes import (
    blueprint,
    not_found_page,
    page_action,
    page_id,
    require_page_scope,
    signed_in,
)
from orquestador.api.problems import ApiProblem, as_problem
from orquestador.db.schema import EXECUTION_STATUSES
from orquestador.domain.statuses import BulkStatus
from orquestador.errors import Problem, Refusal
from orquestador.wording import BULK_DONE_WORDS

CRITERIA = tuple(BULK_FILTER["properties"])
REFRESH_SECONDS = 2
# Why a parameter the list's search knows is no filter of a bulk action.
_NOT_BULK_FILTERS = {
    "id": "a bulk action does not take an id: choose by status, flow, machine, error or time",
    "simulation": "dry runs are never taken by a bulk action",
    "requestId": "a bulk action does not take a request id",
}
_FIELD_LABELS = {
    "status": "Status",
    "flowKey": "Flow key",
    "flowId": "Flow version id",
    "errorCode": "Error code",
    "machineId": "Machine",
    "createdAfter": "Created after",
    "createdBefore": "Created before",
}
_TIME_EXAMPLE = "a date and time with its offset, such as 2026-12-01T00:00:00Z"


def _criteria(source: Any) -> dict[str, str]:
    return {name: source[name].strip() for name in CRITERIA if source.get(name, "").strip()}


def _unknown_filters(source: Any, known: tuple[str, ...]) -> dict[str, str]:
    """A problem per name a bulk form does not take. Refused, never ignored: a bulk of
    every execution but the misspelled criterion is the worst way to find out."""
    return {
        name: _NOT_BULK_FILTERS.get(
            name,
            f"{name} is not a filter a bulk action takes; it takes "
            f"{', '.join(_FIELD_LABELS[criterion] for criterion in CRITERIA).lower()}",
        )
        for name in source
        if name not in known
    }


def _field_problems(refused: ApiProblem) -> dict[str, str]:
    """A refusal's problems by the form field they are about ("" for the form as a whole)."""
    placed: dict[str, str] = {}
    for problem in refused.problems:
        name = problem.path.rsplit("/", 1)[-1]
        if name in ("createdAfter", "createdBefore"):
            message = _TIME_EXAMPLE
        elif name == "flowId":
            message = "a flow version's id (a UUID); for every version, give its key"
        else:
            message = problem.message
        if name not in (*CRITERIA, "reason"):
            name = ""
        placed[name] = f"{placed[name]}; {message}" if name in placed else message
    if not placed:
        placed[""] = refused.detail or refused.code
    return placed


def _require_bulk_scope() -> None:
    require_page_scope(*sorted(set(ACTION_SCOPES.values())), what="bulk actions")


def _allowed_actions() -> list[str]:
    return [action for action, scope in ACTION_SCOPES.items() if g.caller.has_scope(scope)]


def _preview_page(
    *,
    criteria: dict[str, str],
    action: str,
    preview: dict[str, Any] | None,
    problems: dict[str, str],
    reason: str = "",
    status: int = 200,
) -> Response:
    page = render_template(
        "bulk_preview.html",
        caller=g.caller,
        criteria=criteria,
        statuses=EXECUTION_STATUSES,
        actions=_allowed_actions(),
        action=action,
        preview=preview,
        problems=problems,
        reason=reason,
    )
    return Response(page, status=status, mimetype="text/html")


@blueprint.get("/bulk")
@signed_in
def bulk_preview() -> Any:
    _require_bulk_scope()
    criteria = _criteria(request.args)
    actions = _allowed_actions()
    action = request.args.get("action") or actions[0]
    if action not in actions:
        raise ApiProblem(422, "FORM_INVALID", f"Choose one of: {', '.join(actions)}.")
    unknown = _unknown_filters(request.args, (*CRITERIA, "action"))
    if unknown:
        # Nothing is previewed: the person sees what was not understood, as typed.
        problems = {"": "; ".join(unknown.values()) + "."}
        return _preview_page(
            criteria=criteria, action=action, preview=None, problems=problems, status=400
        )
    preview = None
    if criteria:
        try:
            preview = preview_as(g.caller, action, checked_object(criteria, BULK_FILTER))
        except (ApiProblem, Refusal) as error:
            refused = as_problem(error)
            if refused.status not in (400, 422):
                raise
            return _preview_page(
                criteria=criteria,
                action=action,
                preview=None,
                problems=_field_problems(refused),
                status=422,
            )
    return _preview_page(criteria=criteria, action=action, preview=preview, problems={})


@blueprint.post("/bulk")
@page_action
def start_bulk() -> Any:
    _require_bulk_scope()
    criteria = _criteria(request.form)
    action = request.form.get("action", "")
    reason = request.form.get("reason", "").strip()
    unknown = _unknown_filters(request.form, (*CRITERIA, "action", "reason", CSRF_FIELD))
    if unknown:
        raise ApiProblem(
            400,
            "FORM_INVALID",
            "The form has fields a bulk action does not take: nothing was done.",
            problems=[Problem(f"/{name}", why) for name, why in unknown.items()],
        )
    body = {"filter": criteria, "action": action, "reason": reason}
    try:
        bulk_id, _ = start_as(g.caller, checked_object(body, BULK_BODY))
    except (ApiProblem, Refusal) as error:
        refused = as_problem(error)
        if refused.status not in (400, 422) or action not in _allowed_actions():
            raise
        # The preview again, with the reason as typed and what is wrong beside it.
        problems = _field_problems(refused)
        if "reason" in problems:
            problems["reason"] = "say why: it is kept in the audit of every execution"
        try:
            preview = preview_as(g.caller, action, checked_object(criteria, BULK_FILTER))
        except (ApiProblem, Refusal):
            preview = None
        return _preview_page(
            criteria=criteria,
            action=action,
            preview=preview,
            problems=problems,
            reason=reason,
            status=422,
        )
    return redirect(url_for("ui.bulk_page", bulk_id=str(bulk_id)), 303)


@blueprint.get("/bulk/<bulk_id>")
@signed_in
def bulk_page(bulk_id: str) -> Any:
    _require_bulk_scope()
    found = read_progress(g.caller, page_id(bulk_id))
    if found is None:
        raise not_found_page()
    view = progress_view(found)
    page = render_template(
        "bulk.html",
        caller=g.caller,
        bulk=view,
        done_word=BULK_DONE_WORDS.get(view["action"], "done"),
    )
    answer = Response(page, mimetype="text/html")
    if view["status"] != BulkStatus.DONE:
        answer.headers["Refresh"] = str(REFRESH_SECONDS)  # follows the worker by itself
    return answer
