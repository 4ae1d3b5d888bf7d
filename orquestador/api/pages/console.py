"""The console's read pages beside the executions: a request, flows, a machine, notices,
approvals and schedules, and the navigation between them.

Each page reads through the access component its JSON route uses (ResourceAccess,
NoticeAccess, ApprovalAccess, the flow and schedule stores), with the organization in
the SQL, so a foreign id is the same "not found" page as a missing one. A page that
needs a scope the person's token lacks answers the 403 page. Nothing here changes
anything: the pages' forms are posted elsewhere (api/pages/actions.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import Response, g, render_template, request, url_for

from orquestador.api.access import ExecutionFilter, ResourceAccess
from orquestador.api.claims import (
    SCOPE_APPROVALS_DECIDE,
    SCOPE_FLOWS_ADMIN,
    SCOPE_NOTICES_READ,
    SCOPE_PLANS_ADMIN,
    SCOPE_REQUESTS_WRITE,
    identity_claim_problem,
)
from orquestador.api.context import api_context, engine
from orquestador.api.flow_routes import flow_versions
from orquestador.api.flow_store import find_flow
from orquestador.api.openapi.schedules import LIST_LIMIT
from orquestador.api.pages.execution_page import REFRESH_SECONDS
from orquestador.api.pages.routes import (
    blueprint,
    not_found_page,
    page_facts,
    page_id,
    require_page_scope,
    signed_in,
)
from orquestador.api.pages.start_form import StartForm, empty_form
from orquestador.api.paging import cursor, read_cursor
from orquestador.api.schedule_routes import schedule_view
from orquestador.api.views import (
    command_output_view,
    execution_view,
    flow_version_view,
    flow_view,
)
from orquestador.approvals.access import ApprovalAccess, ApprovalPage, approval_view, is_open
from orquestador.automation.schedules import find_schedule, list_schedules, schedule_id_problem
from orquestador.domain.statuses import (
    UNDER_WAY_COMMAND,
    UNFINISHED,
    ApprovalListing,
    ApprovalStatus,
    ExecutionStatus,
)
from orquestador.machines.liveness import agent_of, agents_seen
from orquestador.notices.access import NoticeAccess, NoticePage, notice_view

# How many rows a page lists before it offers the next page.
PAGE_SIZE = 50
RECONCILIATION = ExecutionStatus.RECONCILIATION_REQUIRED

# The console's sections: label, endpoint, query, the scope that opens it (None: any
# signed-in person), and the endpoints that belong to it.
SECTIONS: tuple[tuple[str, str, dict[str, str], str | None, tuple[str, ...]], ...] = (
    (
        "Executions",
        "ui.executions",
        {},
        None,
        ("ui.executions", "ui.execution_page", "ui.request_page", "ui.machine_page"),
    ),
    ("Reconciliation", "ui.executions", {"status": RECONCILIATION}, None, ()),
    ("Approvals", "ui.approvals", {}, SCOPE_APPROVALS_DECIDE, ("ui.approvals",)),
    ("Notices", "ui.notices", {}, SCOPE_NOTICES_READ, ("ui.notices",)),
    ("Flows", "ui.flows", {}, SCOPE_FLOWS_ADMIN, ("ui.flows", "ui.flow_page")),
    ("Schedules", "ui.schedules", {}, SCOPE_PLANS_ADMIN, ("ui.schedules", "ui.schedule_page")),
)


@blueprint.context_processor
def _navigation() -> dict[str, Any]:
    """The sections the signed-in person may open, the current one marked; and what
    they may open, so a page links only where it would not answer 403."""
    caller = g.get("caller")
    if caller is None:
        return {"sections": [], "may": {}}
    queue = request.endpoint == "ui.executions" and request.args.get("status") == RECONCILIATION
    sections = []
    for label, endpoint, query, scope, belongs in SECTIONS:
        if scope is not None and not caller.has_scope(scope):
            continue
        # The queue is the executions list filtered: it, not Executions, is current there.
        current = queue if label == "Reconciliation" else request.endpoint in belongs and not queue
        sections.append({"label": label, "url": url_for(endpoint, **query), "current": current})
    may = {
        "flows": caller.has_scope(SCOPE_FLOWS_ADMIN),
        "notices": caller.has_scope(SCOPE_NOTICES_READ),
        "approvals": caller.has_scope(SCOPE_APPROVALS_DECIDE),
        "schedules": caller.has_scope(SCOPE_PLANS_ADMIN),
    }
    return {"sections": sections, "may": may}


def _after(args: Mapping[str, str]) -> Any:
    text = args.get("after")
    return read_cursor(text) if text is not None else None


def _execution_items(rows: list[Any]) -> list[dict[str, Any]]:
    """Listed executions as the pages show them (no steps: each links to its page)."""
    return [page_facts(row, execution_view(row, (), ())) for row in rows]


# --- a request -------------------------------------------------------------------------


@blueprint.get("/requests/<request_id>")
@signed_in
def request_page(request_id: str) -> Any:
    identifier = page_id(request_id)
    after = _after(request.args)
    access = ResourceAccess(g.caller)
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            row = access.find_request(connection, identifier)
            if row is None:
                raise not_found_page()
            flow_row = find_flow(connection, org=g.caller.org, flow_id=row.flow_id)
            rows = access.list_executions(
                connection,
                ExecutionFilter(
                    limit=PAGE_SIZE,
                    request_id=identifier,
                    simulation=row.simulation,
                    after=after,
                ),
            )
    more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
    facts = {
        "id": str(row.id),
        "flowId": str(row.flow_id),
        "flowKey": flow_row.key if flow_row is not None else None,
        "flowVersion": flow_row.version if flow_row is not None else None,
        "state": row.state,
        "revision": row.revision,
        "data": row.data,
        "machineId": _request_machine(row),
        "owner": row.owner_id,
        "simulation": row.simulation,
        "busyExecutionId": str(row.busy_execution_id) if row.busy_execution_id else None,
        "createdAt": row.created_at.isoformat(),
        "updatedAt": row.updated_at.isoformat(),
    }
    next_url = (
        url_for("ui.request_page", request_id=str(row.id), after=cursor(rows[-1])) if more else None
    )
    return render_template(
        "request.html",
        caller=g.caller,
        request_facts=facts,
        executions=_execution_items(rows),
        next_url=next_url,
    )


def _request_machine(row: Any) -> str | None:
    """The machine the request names, else the one its data names: REQUEST_MACHINE
    (db/request_machine.py) read from a row already loaded, text as `->>` gives it."""
    if row.machine_id is not None:
        return str(row.machine_id)
    named = row.data.get("machineId") if isinstance(row.data, dict) else None
    if named is None or isinstance(named, str):
        return named
    return json.dumps(named, ensure_ascii=False)


# --- flows -----------------------------------------------------------------------------


@blueprint.get("/flows")
@signed_in
def flows() -> Any:
    require_page_scope(SCOPE_FLOWS_ADMIN, what="reading flows")
    with engine().connect() as connection:
        rows = flow_versions(connection, org=g.caller.org, key=None)
    by_key: dict[str, dict[str, Any]] = {}
    for row in rows:  # by key, newest version first
        if row.key not in by_key:
            by_key[row.key] = {**flow_version_view(row), "versions": 0}
        by_key[row.key]["versions"] += 1
    return render_template("flows.html", caller=g.caller, flows=list(by_key.values()))


@blueprint.get("/flows/<flow_id>")
@signed_in
def flow_page(flow_id: str) -> Any:
    require_page_scope(SCOPE_FLOWS_ADMIN, what="reading flows")
    found = read_flow_page(page_id(flow_id))
    return flow_page_response(found, start=found.blank_start)


@dataclass(frozen=True)
class FlowPage:
    """A flow version as its page shows it, with its key's versions and an empty Start form."""

    row: Any
    versions: list[Any]

    @property
    def blank_start(self) -> StartForm:
        return empty_form(self.row.definition)


def read_flow_page(identifier: uuid.UUID) -> FlowPage:
    """The flow of the person's organization, or the not-found page."""
    with engine().connect() as connection:
        row = find_flow(connection, org=g.caller.org, flow_id=identifier)
        if row is None:
            raise not_found_page()
        versions = flow_versions(connection, org=g.caller.org, key=row.key)
    return FlowPage(row, versions)


def flow_page_response(
    found: FlowPage,
    *,
    start: StartForm,
    status: int = 200,
    dry_run: dict[str, Any] | None = None,
) -> Response:
    """The flow page; `start` is its Start form, empty or as a person typed it; `dry_run`
    its dry-run form as typed, with `problems` by field ("" for the form)."""
    view = flow_view(found.row)
    page = render_template(
        "flow.html",
        caller=g.caller,
        flow=view,
        versions=[flow_version_view(v) for v in found.versions],
        definition=definition_in_words(view["definition"]),
        start=start,
        dry=dry_run or {"data": "{}", "outcomes": "", "problems": {}},
        may_start=g.caller.has_scope(SCOPE_REQUESTS_WRITE),
    )
    return Response(page, status=status, mimetype="text/html")


def definition_in_words(definition: Any) -> dict[str, Any]:
    """A stored definition as the flow page tells it: states, and each transition from
    where to where, with its actions and its decision table's rules in words.

    Read defensively: a definition stored under older rules may lack a part; what is
    missing is left out rather than failing the page.
    """
    raw = definition if isinstance(definition, dict) else {}
    transitions = []
    for transition in _dicts(raw.get("transitions")):
        decision = transition.get("decision")
        transitions.append(
            {
                "id": transition.get("id"),
                "from": _texts(transition.get("from")),
                "to": transition.get("to"),
                "actions": [
                    {
                        "id": action.get("id"),
                        "capability": action.get("capability"),
                        "version": action.get("version"),
                        "onError": action.get("onError"),
                    }
                    for action in _dicts(transition.get("actions"))
                ],
                "decision": _decision_in_words(decision) if isinstance(decision, dict) else None,
                "updates": [update.get("path") for update in _dicts(transition.get("updates"))],
                "concurrency": transition.get("concurrency"),
            }
        )
    return {
        "trigger": raw.get("trigger"),
        "start": raw.get("start"),
        "initialState": raw.get("initialState"),
        "states": _texts(raw.get("states")),
        "priority": raw.get("priority"),
        "transitions": transitions,
        "dataSchema": raw.get("dataSchema"),
        # State -> the transition a finish into it continues with, by itself.
        "continue": {
            state: transition
            for state, transition in (
                raw.get("continue").items() if isinstance(raw.get("continue"), dict) else ()
            )
            if isinstance(state, str) and isinstance(transition, str)
        },
    }


def _decision_in_words(decision: dict[str, Any]) -> dict[str, Any]:
    inputs = _texts(decision.get("inputs"))
    rules = []
    for rule in _dicts(decision.get("rules")):
        tests = rule.get("when") if isinstance(rule.get("when"), list) else []
        conditions = [
            f"{source} is {test}"
            for source, test in zip(inputs, tests, strict=False)
            if str(test).strip() != "-"
        ]
        then = rule.get("then") if isinstance(rule.get("then"), dict) else {}
        rules.append(
            {
                "id": rule.get("id"),
                "when": f"when {' and '.join(conditions)}" if conditions else "always",
                "to": then.get("to"),
                "outcome": then.get("outcome"),
                "others": {k: v for k, v in then.items() if k not in ("to", "outcome")},
            }
        )
    return {"hitPolicy": decision.get("hitPolicy"), "inputs": inputs, "rules": rules}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _texts(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


# --- a machine -------------------------------------------------------------------------


@blueprint.get("/machines/<path:machine_id>")
@signed_in
def machine_page(machine_id: str) -> Any:
    # No machine can have an id an agent token could not name: missing, like any other.
    if identity_claim_problem(machine_id):
        raise not_found_page()
    access = ResourceAccess(g.caller)
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            commands = access.machine_commands(connection, machine_id, PAGE_SIZE)
            rows = access.list_executions(
                connection, ExecutionFilter(limit=PAGE_SIZE, machine_id=machine_id)
            )
            offline_seconds = api_context().settings.agent_offline_seconds
            seen = agents_seen(
                connection,
                org_id=g.caller.org,
                machine_ids=[machine_id],
                offline_seconds=offline_seconds,
            )
    if not commands and not rows:
        # Nothing the person may see touched it: another organization's machine, or
        # another person's, is the same as one that never existed.
        raise not_found_page()
    facts = [_command_facts(command) for command in commands[:PAGE_SIZE]]
    # While a command is under way the page follows it (and its output) by itself.
    # An under-way command changes without a person: the page refreshes while one is.
    moving = any(c["status"] in UNDER_WAY_COMMAND for c in facts)
    page = render_template(
        "machine.html",
        caller=g.caller,
        machine_id=machine_id,
        commands=facts,
        more_commands=len(commands) > PAGE_SIZE,
        executions=_execution_items(rows[:PAGE_SIZE]),
        more_executions=len(rows) > PAGE_SIZE,
        search_url=url_for("ui.executions", machineId=machine_id),
        refresh_seconds=REFRESH_SECONDS if moving else None,
        agent=agent_of(seen, machine_id, offline_seconds).as_json(),
    )
    response = Response(page, mimetype="text/html")
    if moving:
        response.headers["Refresh"] = str(REFRESH_SECONDS)
    return response


def _command_facts(row: Any) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "command": row.command,
        "args": list(row.args or []),
        "status": row.status,
        "exitCode": row.exit_code,
        "createdAt": row.created_at.isoformat(),
        "sentAt": row.sent_at.isoformat() if row.sent_at else None,
        "finishedAt": row.finished_at.isoformat() if row.finished_at else None,
        "stopAskedAt": row.cancel_requested_at.isoformat() if row.cancel_requested_at else None,
        "deliverBy": row.deliver_by.isoformat(),
        "executionId": str(row.execution_id),
        "actionId": row.action_id,
        **command_output_view(row),
    }


# --- notices, approvals, schedules -----------------------------------------------------


@blueprint.get("/notices")
@signed_in
def notices() -> Any:
    require_page_scope(SCOPE_NOTICES_READ, what="reading notices")
    show_all = request.args.get("show") == "all"
    page = NoticePage(limit=PAGE_SIZE, include_dismissed=show_all, after=_after(request.args))
    with engine().connect() as connection:
        rows = NoticeAccess(g.caller.org).list_notices(connection, page)
    more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
    query = {"show": "all"} if show_all else {}
    return render_template(
        "notices.html",
        caller=g.caller,
        notices=[notice_view(row) for row in rows],
        show_all=show_all,
        open_url=url_for("ui.notices"),
        all_url=url_for("ui.notices", show="all"),
        next_url=url_for("ui.notices", **query, after=cursor(rows[-1])) if more else None,
    )


@blueprint.get("/approvals")
@signed_in
def approvals() -> Any:
    require_page_scope(SCOPE_APPROVALS_DECIDE, what="deciding approvals")
    closed = request.args.get("status") == ApprovalListing.CLOSED
    status = ApprovalListing.CLOSED if closed else ApprovalListing.OPEN
    page = ApprovalPage(limit=PAGE_SIZE, status=status, after=_after(request.args))
    caller = g.caller
    with engine().connect() as connection:
        rows = ApprovalAccess(caller.org, caller.sub, caller.scopes).list(connection, page)
    more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
    items = []
    for row in rows:
        seconds_left = int((row.deadline_at - row.read_at).total_seconds())
        items.append(
            {
                **approval_view(row),
                "askedBy": list(row.requesters or []),
                # Whoever asked for it or owns the request never decides it (SELF_APPROVAL):
                # the page offers them no Approve or Reject to be refused.
                "mayDecide": caller.sub not in (row.requesters or []),
                "secondsLeft": seconds_left if is_open(row) else None,
                "state": _approval_state(row),
            }
        )
    return render_template(
        "approvals.html",
        caller=caller,
        approvals=items,
        status=status,
        open_url=url_for("ui.approvals"),
        closed_url=url_for("ui.approvals", status=ApprovalListing.CLOSED.value),
        next_url=url_for("ui.approvals", status=status, after=cursor(rows[-1])) if more else None,
    )


def _approval_state(row: Any) -> str:
    """Open, how it was decided, or why it can no longer be decided."""
    if is_open(row):
        return ApprovalStatus.OPEN
    if row.status != ApprovalStatus.OPEN:
        return row.status
    if row.execution_status not in UNFINISHED:
        return f"closed: its execution is {row.execution_status}"
    return "closed: the deadline passed"


@blueprint.get("/schedules")
@signed_in
def schedules() -> Any:
    require_page_scope(SCOPE_PLANS_ADMIN, what="reading schedules")
    with engine().connect() as connection:
        found = list_schedules(connection, org=g.caller.org, limit=LIST_LIMIT)
        flows_by_id = {
            str(row.id): row for row in flow_versions(connection, org=g.caller.org, key=None)
        }
    items = [_schedule_facts(schedule, flows_by_id) for schedule in found]
    return render_template("schedules.html", caller=g.caller, schedules=items)


def _schedule_facts(schedule: Any, flows_by_id: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule as the pages show it: its flow by key and version where it is known."""
    view = schedule_view(schedule)
    flow_row = flows_by_id.get(view["flowId"])
    view["flowName"] = view["flowKey"] or (flow_row.key if flow_row is not None else None)
    view["flowVersion"] = flow_row.version if flow_row is not None else None
    return view


@blueprint.get("/schedules/<schedule_id>")
@signed_in
def schedule_page(schedule_id: str) -> Any:
    require_page_scope(SCOPE_PLANS_ADMIN, what="reading schedules")
    if schedule_id_problem(schedule_id) is not None:
        raise not_found_page()
    access = ResourceAccess(g.caller)
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            found = find_schedule(connection, org=g.caller.org, key=schedule_id)
            if found is None:
                raise not_found_page()
            flows_by_id = {
                str(row.id): row for row in flow_versions(connection, org=g.caller.org, key=None)
            }
            rows = access.list_executions(
                connection,
                ExecutionFilter(
                    limit=PAGE_SIZE, schedule_id=schedule_id, after=_after(request.args)
                ),
            )
    more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
    next_url = (
        url_for("ui.schedule_page", schedule_id=schedule_id, after=cursor(rows[-1]))
        if more
        else None
    )
    return render_template(
        "schedule.html",
        caller=g.caller,
        schedule=_schedule_facts(found, flows_by_id),
        executions=_execution_items(rows),
        next_url=next_url,
    )


@blueprint.app_template_filter("pretty_json")
def _pretty_json(value: Any) -> str:
    """A JSON document indented for reading, as plain text (the template escapes it)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)
