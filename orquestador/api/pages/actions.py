"""What a person does from the pages: each a POST form, answered by a redirect.

Every action goes through `page_action` (same origin, signed in, the session's CSRF
token), checks its own scope, and then calls the very function the JSON API calls with
the person as the actor, so the rules, the refusals and the audit trail are the API's.
A refusal is the error page with the API's problem; success goes back to the page the
form was on, which says what was done.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from flask import Response, g, redirect, render_template, request, url_for

from orquestador.api.access import ResourceAccess
from orquestador.api.approval_routes import MAX_COMMENT_CHARACTERS, decide_as
from orquestador.api.body import checked_object
from orquestador.api.claims import (
    SCOPE_APPROVALS_DECIDE,
    SCOPE_EXECUTIONS_CANCEL,
    SCOPE_EXECUTIONS_RECONCILE,
    SCOPE_FLOWS_ADMIN,
    SCOPE_NOTICES_READ,
    SCOPE_PLANS_ADMIN,
    SCOPE_REQUESTS_WRITE,
)
from orquestador.api.context import api_context, engine
from orquestador.api.dry_run_routes import start_dry_run
from orquestador.api.execution_routes import (
    cancel_as,
    read_evidence,
    read_execution,
    reconcile_as,
)
from orquestador.api.flow_store import find_flow
from orquestador.api.notice_routes import dismiss_as
from orquestador.api.openapi.automation import DRY_RUN_BODY
from orquestador.api.pages.console import flow_page_response, read_flow_page
from orquestador.api.pages.execution_page import request_when_accepted
from orquestador.api.pages.routes import (
    blueprint,
    not_found_page,
    page_action,
    page_facts,
    page_id,
    require_page_scope,
    signed_in,
)
from orquestador.api.pages.start_form import read_start_form, with_refusal
from orquestador.api.problems import ApiProblem, as_problem
from orquestador.api.quota_checks import require_open_execution_room
from orquestador.api.rollout_routes import mark_as, retry_as
from orquestador.api.run_routes import start_run
from orquestador.api.schemas import RECONCILIATION_BODY, RUN_BODY
from orquestador.api.sign_in_links import landing_page
from orquestador.approvals.store import DECISIONS
from orquestador.automation.firing import run_now
from orquestador.automation.schedules import (
    FlowNotFound,
    ScheduleRefused,
    delete_schedule,
    schedule_id_problem,
    set_paused,
)
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.json_text import parse_json
from orquestador.errors import Problem, Refusal

MAX_REASON_CHARACTERS = 2000

# What the page a form returns to says about it: only these words, never text from the URL.
DONE = {
    "cancelled": "The cancel was applied as the write rule allows.",
    "cancel-requested": "Cancel requested: the step's call is running; the execution stops "
    "when the call returns, as the write rule allows.",
    "approved": "You approved it.",
    "rejected": "You rejected it.",
    "dismissed": "The notice was dismissed.",
    "reconciled-confirm": "Confirmed: the step's effect is recorded as done; the flow goes on.",
    "reconciled-retry": "The step runs again with the same external key.",
    "reconciled-fail": "The transition ended as failed.",
    "dry-run": "The dry run started: nothing it does reaches a machine, a provider or a mailbox.",
    "paused": "The schedule is paused: it fires no more until it is resumed.",
    "resumed": "The schedule runs again, from its next fire time after now.",
    "ran": "The schedule fired now: this is the execution it started.",
    "deleted": "The schedule was deleted; what it started stays.",
    "started": "The run started: this page follows it until it ends.",
    "rollout-pause": "The rollout is paused: no child starts until it resumes.",
    "rollout-resume": "The rollout runs again.",
    "rollout-cancel": "The rollout was cancelled: no child starts; the running ones were "
    "cancelled as the write rule allows.",
    "rollout-retry-failed": "A new rollout over the failed children started: this is it.",
}


@blueprint.app_context_processor
def _what_was_done() -> dict[str, Any]:
    """`done`: what the form that led here did; `here`: where a form sends the person back."""
    kept = [(name, value) for name, value in request.args.items(multi=True) if name != "done"]
    here = f"{request.path}?{urlencode(kept)}" if kept else request.path
    return {"done": DONE.get(request.args.get("done", "")), "here": here}


def _text(name: str, *, required: bool, limit: int) -> str:
    value = request.form.get(name, "").strip()
    if required and not value:
        raise ApiProblem(422, "FORM_INVALID", f"Fill in the {name}: it is kept in the audit trail.")
    if len(value) > limit:
        raise ApiProblem(422, "FORM_INVALID", f"The {name} is longer than {limit} characters.")
    return value


def _back(default: str, done: str) -> Any:
    """Back to the page the form names (only a page of this UI), saying what was done."""
    named = request.form.get("next")
    target = (landing_page(named) if named else None) or default
    joiner = "&" if "?" in target else "?"
    return redirect(f"{target}{joiner}done={done}", 303)


@blueprint.post("/executions/<execution_id>/cancel")
@page_action
def cancel_execution(execution_id: str) -> Any:
    identifier = page_id(execution_id)
    require_page_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE, what="cancelling")
    reason = request.form.get("reason", "").strip()
    problem = None
    if not reason:
        problem = "Say why: it is kept in the audit trail with your name."
    elif len(reason) > MAX_REASON_CHARACTERS:
        problem = f"At most {MAX_REASON_CHARACTERS} characters."
    if problem is not None:
        # The form again, with what was typed and what is wrong beside it.
        return _cancel_page(identifier, reason=reason, problem=problem, status=422)
    _, cancelled = cancel_as(g.caller, identifier, reason)
    done = "cancel-requested" if cancelled.requested else "cancelled"
    return _back(url_for("ui.execution_page", execution_id=str(identifier)), done)


@blueprint.post("/executions/<execution_id>/rollout/<what>")
@page_action
def steer_rollout(execution_id: str, what: str) -> Any:
    identifier = page_id(execution_id)
    page = url_for("ui.execution_page", execution_id=str(identifier))
    if what == "retry-failed":
        require_page_scope(SCOPE_EXECUTIONS_RECONCILE, what="retrying a rollout's failed children")
        retried = retry_as(g.caller, identifier)
        again = url_for("ui.execution_page", execution_id=retried["executionId"])
        return redirect(f"{again}?done=rollout-retry-failed", 303)
    if what not in ("pause", "resume", "cancel"):
        raise not_found_page()
    require_page_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE, what="steering a rollout")
    reason = _text("reason", required=what == "cancel", limit=MAX_REASON_CHARACTERS)
    mark_as(g.caller, identifier, what, reason)
    return _back(page, f"rollout-{what}")


@blueprint.post("/approvals/<approval_id>/decision")
@page_action
def decide_approval(approval_id: str) -> Any:
    identifier = page_id(approval_id)
    require_page_scope(SCOPE_APPROVALS_DECIDE, what="deciding approvals")
    decision = request.form.get("decision", "")
    if decision not in DECISIONS:
        raise ApiProblem(422, "FORM_INVALID", "Choose to approve or to reject.")
    comment = _text("comment", required=False, limit=MAX_COMMENT_CHARACTERS)
    after = decide_as(g.caller, identifier, decision, comment)
    page = url_for("ui.execution_page", execution_id=str(after.execution_id))
    return _back(page, decision)


@blueprint.post("/notices/<notice_id>/dismiss")
@page_action
def dismiss_notice(notice_id: str) -> Any:
    identifier = page_id(notice_id)
    require_page_scope(SCOPE_NOTICES_READ, what="dismissing notices")
    with engine().begin() as conn:
        row = dismiss_as(g.caller, conn, identifier)
    if row is None:
        raise not_found_page()
    default = (
        url_for("ui.execution_page", execution_id=str(row.execution_id))
        if row.execution_id
        else url_for("ui.executions")
    )
    return _back(default, "dismissed")


@blueprint.get("/executions/<execution_id>/cancel")
@signed_in
def cancel_form(execution_id: str) -> Any:
    identifier = page_id(execution_id)
    require_page_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE, what="cancelling")
    return _cancel_page(identifier, reason="", problem=None, status=200)


def _cancel_page(
    identifier: uuid.UUID, *, reason: str, problem: str | None, status: int
) -> Response:
    found = read_execution(ResourceAccess(g.caller), identifier)
    if found is None:
        raise not_found_page()
    page = render_template(
        "cancel.html",
        caller=g.caller,
        execution=page_facts(found.row, found.view),
        reason_limit=MAX_REASON_CHARACTERS,
        reason=reason,
        problem=problem,
    )
    return Response(page, status=status, mimetype="text/html")


@blueprint.post("/flows/<flow_id>/dry-runs")
@page_action
def start_flow_dry_run(flow_id: str) -> Any:
    """A dry run from the flow page. What the form or the API refuses shows the flow page
    again with the form as typed and each problem beside its field."""
    identifier = page_id(flow_id)
    require_page_scope(SCOPE_FLOWS_ADMIN, what="starting dry runs")
    typed = {
        name: request.form.get(name, "") for name in ("transition", "state", "data", "outcomes")
    }
    problems: dict[str, str] = {}
    body: dict[str, Any] = {"transition": typed["transition"], "data": {}}
    for name, example in (("data", "{}"), ("outcomes", '{"step": {"error": "CODE"}}')):
        text = typed[name].strip()
        if not text:
            continue
        try:
            body[name] = parse_json(text)
        except ValueError:
            problems[name] = f"This is not valid JSON: give an object, such as {example}."
    if typed["state"]:
        body["state"] = typed["state"]
    if not problems:
        try:
            execution_id, _ = start_dry_run(
                g.caller, identifier, checked_object(body, DRY_RUN_BODY)
            )
        except (ApiProblem, Refusal) as error:
            refused = as_problem(error)
            if refused.status not in (400, 409, 422):
                raise
            for problem in refused.problems or [Problem("", refused.detail or refused.code)]:
                name = problem.path.strip("/").split("/", 1)[0]
                name = name if name in typed else ""
                said = problem.message if name else (refused.detail or problem.message)
                problems[name] = f"{problems[name]}; {said}" if name in problems else said
            problems.setdefault("", refused.detail or refused.code)
        else:
            page = url_for("ui.execution_page", execution_id=str(execution_id))
            return redirect(f"{page}?done=dry-run", 303)
    found = read_flow_page(identifier)
    return flow_page_response(
        found,
        start=found.blank_start,
        status=422,
        dry_run={**typed, "problems": problems},
    )


@blueprint.post("/flows/<flow_id>/runs")
@page_action
def start_flow_run(flow_id: str) -> Any:
    """The Start form: a real run of this flow version, as `POST /runs` starts one. What
    the form or the API refuses shows the flow page again, as typed, with each problem
    next to its field."""
    identifier = page_id(flow_id)
    # The form is on the flow page, and a refusal shows that page again.
    require_page_scope(SCOPE_FLOWS_ADMIN, what="reading flows")
    require_page_scope(SCOPE_REQUESTS_WRITE, what="starting runs")
    found = read_flow_page(identifier)
    typed, body = read_start_form(found.blank_start, request.form)
    if body is None:
        return flow_page_response(found, start=typed, status=422)
    try:
        started = start_run(g.caller, checked_object({**body, "flow": str(identifier)}, RUN_BODY))
    except (ApiProblem, Refusal) as error:
        refused = as_problem(error)
        if refused.status not in (409, 422):
            raise
        return flow_page_response(found, start=with_refusal(typed, refused), status=refused.status)
    page = url_for("ui.execution_page", execution_id=str(started.execution_id))
    return redirect(f"{page}?done=started", 303)


# --- reconciliation ------------------------------------------------------------------

# Rows of the correction form (no script adds more; the API takes up to 50).
CORRECTION_ROWS = 3


@blueprint.get("/executions/<execution_id>/reconcile")
@signed_in
def reconcile_form(execution_id: str) -> Any:
    identifier = page_id(execution_id)
    require_page_scope(SCOPE_EXECUTIONS_RECONCILE, what="deciding reconciliations")
    return _reconcile_page(identifier, typed={}, problems={}, status=200)


def _reconcile_page(
    identifier: uuid.UUID, *, typed: dict[str, str], problems: dict[str, str], status: int
) -> Response:
    """The decision page; after a refusal, with what was typed and what is wrong beside it
    (`problems` by field name, "<decision>" for a decision's form as a whole)."""
    evidence = read_evidence(g.caller, identifier)
    found = read_execution(ResourceAccess(g.caller), identifier, for_page=True)
    if evidence is None or found is None:
        raise not_found_page()
    with engine().connect() as connection:
        flow = find_flow(connection, org=g.caller.org, flow_id=found.row.flow_id)
    steps = {step["actionId"]: step for step in found.view["steps"]}
    page = render_template(
        "reconcile.html",
        caller=g.caller,
        execution=page_facts(found.row, found.view),
        evidence=evidence,
        step=steps.get(evidence["inDoubt"] or ""),
        request_now=found.request,
        request_then=request_when_accepted(found),
        states=FlowDefinition.from_json(flow.definition).states if flow is not None else (),
        correction_rows=range(1, CORRECTION_ROWS + 1),
        reason_limit=MAX_REASON_CHARACTERS,
        typed=typed,
        problems=problems,
        refused_forms={name.split("-", 1)[0] for name in problems},
    )
    return Response(page, status=status, mimetype="text/html")


@blueprint.post("/executions/<execution_id>/reconciliation")
@page_action
def reconcile_execution(execution_id: str) -> Any:
    identifier = page_id(execution_id)
    require_page_scope(SCOPE_EXECUTIONS_RECONCILE, what="deciding reconciliations")
    decision = request.form.get("decision", "")
    if decision not in ("confirm", "retry", "fail"):
        raise ApiProblem(422, "FORM_INVALID", "Choose confirm, retry or fail.")
    # What the person typed, kept under the decision's own field names.
    typed = {f"{decision}-{name}": value for name, value in request.form.items()}
    problems: dict[str, str] = {}
    reason = request.form.get("reason", "").strip()
    if not reason:
        problems["reason"] = "Say why: it is kept in the audit trail with your name."
    elif len(reason) > MAX_REASON_CHARACTERS:
        problems["reason"] = f"At most {MAX_REASON_CHARACTERS} characters."
    body: dict[str, Any] = {
        "decision": decision,
        "actionId": request.form.get("actionId") or None,
        "reason": reason,
    }
    rows: list[int] = []  # the form row of each correction entry
    if decision == "confirm":
        try:
            body["output"] = parse_json(request.form.get("output", "").strip() or "{}")
        except ValueError:
            problems["output"] = 'Not JSON: the output is an object such as {"chargeId": "ch_1"}.'
    elif decision == "fail" and request.form.get("toState"):
        body["toState"] = request.form["toState"]
    elif decision == "retry":
        correction = []
        for n in range(1, CORRECTION_ROWS + 1):
            path = request.form.get(f"path{n}", "").strip()
            text = request.form.get(f"value{n}", "")
            if not path:
                if text.strip():
                    problems[f"path{n}"] = "Say which field this value goes to, e.g. /plan."
                continue
            if not text.strip():
                problems[f"value{n}"] = (
                    f'Give the new value for {path}: for a text field just the text (write "" '
                    "for an empty one)."
                )
                continue
            correction.append({"path": path, "text": text.strip()})
            rows.append(n)
        if correction:
            body["correction"] = correction
    if not problems:
        try:
            reconcile_as(g.caller, identifier, checked_object(body, RECONCILIATION_BODY))
        except (ApiProblem, Refusal) as error:
            refused = as_problem(error)
            if refused.status != 422:
                raise
            problems = _decision_field_problems(refused, rows)
    if problems:
        placed = {f"{decision}-{name}": message for name, message in problems.items()}
        return _reconcile_page(identifier, typed=typed, problems=placed, status=422)
    page = url_for("ui.execution_page", execution_id=str(identifier))
    return redirect(f"{page}?done=reconciled-{decision}", 303)


def _decision_field_problems(refused: ApiProblem, rows: list[int]) -> dict[str, str]:
    """A refused decision's problems by the form field they are about ("" for the form)."""
    placed: dict[str, str] = {}
    for problem in refused.problems:
        parts = problem.path.split("/")
        name = ""
        if len(parts) > 2 and parts[1] == "correction" and parts[2].isdigit():
            index = int(parts[2])
            if index < len(rows):
                field = "path" if len(parts) > 3 and parts[3] == "path" else "value"
                name = f"{field}{rows[index]}"
        elif len(parts) > 1 and parts[1] in ("output", "toState", "reason"):
            name = parts[1]
        message = problem.message
        placed[name] = f"{placed[name]}; {message}" if name in placed else message
    if not placed:
        placed[""] = refused.detail or refused.code
    elif "" not in placed and refused.detail:
        placed[""] = refused.detail
    return placed


# --- schedules ---------------------------------------------------------------------------


def _schedule_key(schedule_id: str) -> str:
    if schedule_id_problem(schedule_id) is not None:
        raise not_found_page()
    return schedule_id


@blueprint.post("/schedules/<schedule_id>/pause")
@page_action
def pause_schedule(schedule_id: str) -> Any:
    return _set_paused(_schedule_key(schedule_id), paused=True)


@blueprint.post("/schedules/<schedule_id>/resume")
@page_action
def resume_schedule(schedule_id: str) -> Any:
    return _set_paused(_schedule_key(schedule_id), paused=False)


def _set_paused(key: str, *, paused: bool) -> Any:
    require_page_scope(SCOPE_PLANS_ADMIN, what="pausing and resuming schedules")
    try:
        with engine().begin() as conn:
            found = set_paused(conn, org=g.caller.org, key=key, paused=paused, actor=g.caller.sub)
    except (ScheduleRefused, FlowNotFound) as refused:
        raise _schedule_refusal(refused) from None
    if found is None:
        raise not_found_page()
    return _back(url_for("ui.schedule_page", schedule_id=key), "paused" if paused else "resumed")


@blueprint.post("/schedules/<schedule_id>/run")
@page_action
def run_schedule(schedule_id: str) -> Any:
    key = _schedule_key(schedule_id)
    require_page_scope(SCOPE_PLANS_ADMIN, what="running schedules")
    require_open_execution_room(g.caller.org)
    try:
        with engine().begin() as conn:
            fired = run_now(
                conn,
                org=g.caller.org,
                key=key,
                actor=g.caller.sub,
                max_attempts=api_context().settings.execution_max_attempts,
            )
    except (ScheduleRefused, FlowNotFound) as refused:
        raise _schedule_refusal(refused) from None
    if fired is None:
        raise not_found_page()
    page = url_for("ui.execution_page", execution_id=str(fired.execution_id))
    return redirect(f"{page}?done=ran", 303)


@blueprint.post("/schedules/<schedule_id>/delete")
@page_action
def delete_schedule_page(schedule_id: str) -> Any:
    key = _schedule_key(schedule_id)
    require_page_scope(SCOPE_PLANS_ADMIN, what="deleting schedules")
    with engine().begin() as conn:
        deleted = delete_schedule(conn, org=g.caller.org, key=key)
    if not deleted:
        raise not_found_page()
    return redirect(f"{url_for('ui.schedules')}?done=deleted", 303)


def _schedule_refusal(refused: ScheduleRefused | FlowNotFound) -> ApiProblem:
    """The flow refuses what the schedule would start: the problem page, in its words."""
    if isinstance(refused, FlowNotFound):
        return ApiProblem(422, "DATA_INVALID", "The schedule's flow no longer exists.")
    return ApiProblem(
        422,
        refused.code,
        f"{refused} Put the schedule again with a flow or data it accepts.",
        problems=refused.problems,
    )
