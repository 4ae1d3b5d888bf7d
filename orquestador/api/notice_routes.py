"""Panel notices and an organization's notification preferences."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import Connection, Row, insert

from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_NOTICES_READ, SCOPE_ORG_ADMIN
from orquestador.api.context import engine
from orquestador.api.paging import cursor, page_limit, query_problem, read_cursor
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX
from orquestador.db.schema import audit_event
from orquestador.notices.access import NoticeAccess, NoticePage, notice_view
from orquestador.notices.preferences import (
    preference_problems,
    read_preferences,
    save_preferences,
)

log = logging.getLogger(__name__)

blueprint = Blueprint("notices", __name__, url_prefix=API_PREFIX)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
AUDIT_PREFERENCES_CHANGED = "NOTIFICATION_PREFERENCES_CHANGED"

PREFERENCES_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "optOut": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Categories whose notices are never e-mailed (known: automation).",
        },
        "recipients": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Plain addresses (ops@example.com) the organization's e-mails go to.",
        },
    },
    "required": ["optOut", "recipients"],
    "additionalProperties": False,
}


# --- notices -------------------------------------------------------------------------


@blueprint.get("/notices")
@requires_scope(SCOPE_NOTICES_READ)
def listing() -> Response:
    page = _notice_page(request.args)
    with engine().connect() as conn:
        rows = NoticeAccess(current_caller().org).list_notices(conn, page)
    more, rows = len(rows) > page.limit, rows[: page.limit]
    return jsonify(
        {
            "items": [notice_view(row) for row in rows],
            "next": cursor(rows[-1]) if more else None,
        }
    )


@blueprint.post("/notices/<uuid:notice_id>/dismiss")
@requires_scope(SCOPE_NOTICES_READ)
def dismiss(notice_id: uuid.UUID) -> Response:
    with engine().begin() as conn:
        row = dismiss_as(current_caller(), conn, notice_id)
    if row is None:
        raise not_found()
    return jsonify(notice_view(row))


def dismiss_as(caller: Caller, conn: Connection, notice_id: uuid.UUID) -> Row | None:
    """Dismiss for `caller` (the API's and the pages' one way); None when not visible."""
    row = NoticeAccess(caller.org).dismiss(conn, notice_id, caller.sub)
    if row is not None:
        log.info("notice dismissed", extra={"notice_id": str(notice_id)})
    return row


# --- preferences ---------------------------------------------------------------------


def _own_org(org: str) -> str:
    # Another organization's preferences answer like a path that does not exist.
    if org != current_caller().org:
        raise not_found()
    return org


@blueprint.get("/orgs/<org>/notification-preferences")
@requires_scope(SCOPE_ORG_ADMIN)
def read_notification_preferences(org: str) -> Response:
    org = _own_org(org)
    with engine().connect() as conn:
        return jsonify(read_preferences(conn, org).view())


@blueprint.put("/orgs/<org>/notification-preferences")
@requires_scope(SCOPE_ORG_ADMIN)
def replace_notification_preferences(org: str) -> Response:
    org = _own_org(org)
    body = read_json_object(PREFERENCES_BODY)
    problems = preference_problems(body["optOut"], body["recipients"])
    if problems:
        raise ApiProblem(
            422,
            "PREFERENCES_INVALID",
            "Unknown categories or unusable addresses; `problems` names each.",
            problems=problems,
        )
    caller = current_caller()
    with engine().begin() as conn:
        saved = save_preferences(conn, org, body["optOut"], body["recipients"])
        conn.execute(
            insert(audit_event).values(
                org_id=org,
                kind=AUDIT_PREFERENCES_CHANGED,
                actor=caller.sub,
                # Who changed what, without the addresses themselves.
                detail={"optOut": saved.opt_out, "recipients": len(saved.recipients)},
            )
        )
    log.info("notification preferences changed", extra={"org_id": org})
    return jsonify(saved.view())


# --- query parameters ----------------------------------------------------------------


def _notice_page(args: Mapping[str, str]) -> NoticePage:
    include = args.get("includeDismissed", "false")
    if include not in ("true", "false"):
        raise query_problem("includeDismissed", "true or false")
    tests = args.get("test", "false")
    if tests not in ("true", "false"):
        raise query_problem("test", "true or false")
    limit = page_limit(args, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    after = args.get("after")
    return NoticePage(
        limit=limit,
        include_dismissed=include == "true",
        tests=tests == "true",
        after=read_cursor(after) if after is not None else None,
    )
