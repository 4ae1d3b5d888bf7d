"""Approvals: the approver's own list, one approval, and the one decision it takes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, jsonify, request

from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_APPROVALS_DECIDE
from orquestador.api.context import engine
from orquestador.api.paging import cursor, page_limit, query_problem, read_cursor
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX
from orquestador.approvals.access import ApprovalAccess, ApprovalPage, approval_view
from orquestador.approvals.store import DECISIONS, record_decision, why_closed
from orquestador.domain.statuses import ApprovalListing, values

log = logging.getLogger(__name__)

blueprint = Blueprint("approvals", __name__, url_prefix=API_PREFIX)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_COMMENT_CHARACTERS = 2000
STATUSES = values(ApprovalListing)

DECISION_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"enum": list(DECISIONS)},
        "comment": {"type": "string", "maxLength": MAX_COMMENT_CHARACTERS},
    },
    "required": ["decision"],
    "additionalProperties": False,
}


def _access(caller: Caller) -> ApprovalAccess:
    return ApprovalAccess(caller.org, caller.sub, caller.scopes)


@blueprint.get("/approvals")
@requires_scope(SCOPE_APPROVALS_DECIDE)
def listing() -> Response:
    page = _page(request.args)
    with engine().connect() as conn:
        rows = _access(current_caller()).list(conn, page)
    more, rows = len(rows) > page.limit, rows[: page.limit]
    return jsonify(
        {"items": [approval_view(row) for row in rows], "next": cursor(rows[-1]) if more else None}
    )


@blueprint.get("/approvals/<uuid:approval_id>")
@requires_scope(SCOPE_APPROVALS_DECIDE)
def one(approval_id: uuid.UUID) -> Response:
    with engine().connect() as conn:
        row = _access(current_caller()).find(conn, approval_id)
    if row is None:
        raise not_found()
    return jsonify(approval_view(row))


@blueprint.post("/approvals/<uuid:approval_id>/decision")
@requires_scope(SCOPE_APPROVALS_DECIDE)
def decide(approval_id: uuid.UUID) -> Response:
    body = read_json_object(DECISION_BODY)
    after = decide_as(current_caller(), approval_id, body["decision"], body.get("comment", ""))
    return jsonify(approval_view(after))


def decide_as(caller: Caller, approval_id: uuid.UUID, decision: str, comment: str) -> Any:
    """Record `caller`'s decision (the API's and the pages' one way); the approval after."""
    with engine().begin() as conn:
        row = _access(caller).find(conn, approval_id, lock=True)
        if row is None:
            raise not_found()
        if caller.sub in row.requesters:
            raise ApiProblem(
                403,
                "SELF_APPROVAL",
                "You asked for this transition or own its request: someone else decides.",
            )
        decided = record_decision(conn, row, caller.sub, decision, comment)
        if decided is None:
            raise ApiProblem(409, "APPROVAL_CLOSED", why_closed(conn, approval_id))
        after = _access(caller).find(conn, approval_id)
    log.info("approval decided", extra={"approval_id": str(approval_id), "decision": decision})
    assert after is not None
    return after


def _page(args: Mapping[str, str]) -> ApprovalPage:
    status = args.get("status", ApprovalListing.OPEN)
    if status not in STATUSES:
        raise query_problem("status", "open, closed or all")
    limit = page_limit(args, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    after = args.get("after")
    return ApprovalPage(
        limit=limit, status=status, after=read_cursor(after) if after is not None else None
    )
