"""What the execution page shows beyond the ExecutionView: the timeline, what started the
execution, the request as it is now, which actions the person may take, and whether the
page refreshes itself."""

from __future__ import annotations

from typing import Any

from orquestador.api.auth import Caller
from orquestador.api.claims import SCOPE_EXECUTIONS_RECONCILE
from orquestador.api.context import engine
from orquestador.api.execution_routes import ExecutionRead, may_cancel
from orquestador.api.pages.timeline import timeline
from orquestador.domain.pointer_updates import data_before_corrections
from orquestador.domain.rollouts import machine_of
from orquestador.domain.statuses import (
    ROLLOUT_ITEM_WAITING,
    UNFINISHED,
    ExecutionStatus,
    RolloutChildStatus,
)
from orquestador.rollouts.reading import latest_rollout, rollout_children, rollout_view

# A rollout's grid links at most this many children of each status; the list (filtered
# by parent) has them all.
GRID_LINKS = 200
# The grid's groups, in the order a person reads them.
GRID_ORDER = (
    RolloutChildStatus.FAILED,
    RolloutChildStatus.RUNNING,
    ROLLOUT_ITEM_WAITING,
    RolloutChildStatus.CANCELLED,
    RolloutChildStatus.SKIPPED,
    RolloutChildStatus.SUCCEEDED,
)

# Statuses that change without a person: the page refreshes itself while in one.
REFRESH_SECONDS = 5


def started_by(read: ExecutionRead) -> dict[str, Any]:
    """Who or what asked for the execution: a schedule's fire, a platform event, the
    continuation of a finished execution, a person.

    Only the acceptance's audit row says so (`startedBy`), never the request data: a person
    may write lookalike data, and a later transition on an event's request is a person's.
    The actor it names is then whom the start acts for (the schedule's author, the
    platform's token); an acceptance recorded before `startedBy` existed shows only that.
    """
    accepted = next((row for row in read.audit if row.kind == "TRANSITION_ACCEPTED"), None)
    actor = accepted.actor if accepted is not None else None
    detail = accepted.detail if accepted is not None and isinstance(accepted.detail, dict) else {}
    starter = detail.get("startedBy")
    if isinstance(starter, dict) and "schedule" in starter:
        return {
            "by": "schedule",
            "schedule": starter["schedule"],
            "fireTime": starter.get("fireTime"),
            # A person's "run now" names them.
            "runBy": starter.get("by"),
        }
    if isinstance(starter, dict) and "continuedFrom" in starter:
        # The flow continued a finished execution by itself, for the same person.
        return {
            "by": "continuation",
            "continuedFrom": starter["continuedFrom"],
            "state": starter.get("state"),
            "actor": actor,
        }
    if isinstance(starter, dict) and "rollout" in starter:
        # A child a rollout step started, for whoever started the rollout.
        return {
            "by": "rollout",
            "parent": starter["rollout"],
            "item": starter.get("item"),
            "actor": actor,
        }
    if isinstance(starter, dict) and "moment" in starter:
        return {
            "by": "event",
            "moment": starter["moment"],
            "plan": starter.get("plan"),
            "occurredAt": starter.get("occurredAt"),
            "actor": actor,
        }
    return {"by": "person", "actor": actor}


def request_when_accepted(read: ExecutionRead) -> dict[str, Any] | None:
    """The request data as the execution accepted it, `{revision, data, corrections}`, or
    None when the records cannot tell.

    No copy of the data is kept at acceptance, and none is needed: while an execution
    holds its request, only that execution's corrections change the data, and each audit
    row keeps what it replaced. So the data then is the data now with them undone, as
    long as the request is still held by it at the revision those corrections explain.
    """
    now = read.request
    accepted = next((row for row in read.audit if row.kind == "TRANSITION_ACCEPTED"), None)
    if now is None or accepted is None or not isinstance(accepted.detail, dict):
        return None
    revision = accepted.detail.get("acceptedRevision")
    corrections = [
        row.detail["correction"]
        for row in read.audit
        if row.kind == "RECONCILIATION_RESOLVED"
        and isinstance(row.detail, dict)
        and row.detail.get("correction")
    ]
    if (
        not isinstance(revision, int)
        or now.busy_execution_id != read.row.id
        or now.revision != revision + len(corrections)
    ):
        return None
    return {
        "revision": revision,
        "data": data_before_corrections(now.data, corrections),
        "corrections": [change for correction in corrections for change in correction],
    }


def rollout_section(read: ExecutionRead, caller: Caller) -> dict[str, Any] | None:
    """The execution's rollout as its page shows it: the counts and budget, its marks, the
    children grouped by status (linked), and what the person may do; None without one."""
    with engine().connect() as connection:
        row = latest_rollout(connection, org=caller.org, execution_id=read.row.id)
        if row is None:
            return None
        view = rollout_view(row)
        children = rollout_children(connection, row)
    groups: dict[str, list[dict[str, Any]]] = {}
    for child in children:
        groups.setdefault(child["status"], []).append(
            {
                "index": child["index"],
                "machine": machine_of(child["item"]) or f"item {child['index']}",
                "executionId": child.get("executionId"),
                "refusal": child.get("refusal"),
            }
        )
    if view["cancelRequested"]:
        state = f"cancelled by {view['cancelledBy']}"
    elif view["paused"]:
        state = f"paused by {view['pausedBy']}: no child starts until it resumes"
    elif view["live"]:
        state = "running"
    else:
        state = "ended"
    return {
        "view": view,
        "state": state,
        "groups": [
            {
                "status": status,
                "count": len(groups[status]),
                "children": groups[status][:GRID_LINKS],
            }
            for status in GRID_ORDER
            if status in groups
        ],
        "may_steer": view["live"] and not view["cancelRequested"] and may_cancel(caller),
        "may_retry": not view["live"]
        and view["failed"] > 0
        and caller.has_scope(SCOPE_EXECUTIONS_RECONCILE),
    }


def page_context(read: ExecutionRead, caller: Caller) -> dict[str, Any]:
    status = read.row.status
    return {
        "rollout": rollout_section(read, caller),
        "timeline": timeline(
            read.audit,
            read.attempts,
            read.view["steps"],
            flow=f"{read.row.flow_key} v{read.row.flow_version}",
            outputs=caller.has_scope(SCOPE_EXECUTIONS_RECONCILE),
        ),
        "started": started_by(read),
        "request_now": read.request,
        "may_cancel": status in UNFINISHED and may_cancel(caller),
        "may_reconcile": status == ExecutionStatus.RECONCILIATION_REQUIRED
        and caller.has_scope(SCOPE_EXECUTIONS_RECONCILE),
        "refresh_seconds": REFRESH_SECONDS if status in UNFINISHED else None,
    }
