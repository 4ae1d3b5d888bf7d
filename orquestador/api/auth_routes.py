"""`POST /auth/links`: a one-time sign-in link to the pages, for a hosting panel's user."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, jsonify, request

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_AUTH_LINK, identity_claim_problem, scope_claim_problem
from orquestador.api.context import api_context, engine
from orquestador.api.problems import ApiProblem
from orquestador.api.sign_in_links import landing_page, new_link
from orquestador.api.views import API_PREFIX
from orquestador.errors import Problem

log = logging.getLogger(__name__)

blueprint = Blueprint("auth_links", __name__, url_prefix=API_PREFIX)

LINK_PATH = "/ui/auth/link"

LINK_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sub": {"type": "string", "description": "Whom the link signs in."},
        "org": {"type": "string", "description": "The caller's own organization."},
        "scope": {
            "type": "string",
            "description": "Space separated; each one the caller holds itself, and never "
            "`auth:link`. `requests:read` lets the person read the pages.",
        },
        "next": {
            "type": "string",
            "maxLength": 2000,
            "description": "The page to land on, under /ui/ (default: the executions).",
        },
    },
    "required": ["sub", "org", "scope"],
    "additionalProperties": False,
}
LINK_ANSWER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "Valid once, for 60 seconds."},
        "expiresAt": {"type": "string", "format": "date-time"},
    },
    "required": ["url", "expiresAt"],
}


@blueprint.post("/auth/links")
@requires_scope(SCOPE_AUTH_LINK)
def create_link() -> tuple[Response, int]:
    body = read_json_object(LINK_BODY)
    caller = current_caller()
    problems = []
    reason = identity_claim_problem(body["sub"])
    if reason:
        problems.append(Problem("/sub", reason))
    reason = scope_claim_problem(body["scope"])
    if reason:
        problems.append(Problem("/scope", reason))
    next_page = landing_page(body.get("next"))
    if next_page is None:
        problems.append(Problem("/next", "must be a page of this server, under /ui/"))
    if problems:
        raise ApiProblem(
            422, "BODY_INVALID", "The link cannot be made as asked.", problems=problems
        )
    if body["org"] != caller.org:
        raise ApiProblem(
            403, "ORG_MISMATCH", "A link signs people in to the caller's own organization only."
        )
    scopes = body["scope"].split()
    # Nobody hands on more than they hold, and the right to make links is never handed on.
    not_held = [s for s in scopes if s == SCOPE_AUTH_LINK or not caller.has_scope(s)]
    if not_held:
        raise ApiProblem(
            403,
            "SCOPE_NOT_HELD",
            "A link carries only scopes the caller holds, and never auth:link.",
            problems=[Problem("/scope", f"not held: {' '.join(not_held)}")],
        )
    assert next_page is not None
    with engine().begin() as conn:
        secret, expires_at = new_link(
            conn,
            org=caller.org,
            subject=body["sub"],
            scopes=scopes,
            next_page=next_page,
            created_by=caller.sub,
        )
    base = api_context().settings.public_base_url.rstrip("/") or request.host_url.rstrip("/")
    log.info("sign-in link made", extra={"org": caller.org, "created_by": caller.sub})
    answer = {"url": f"{base}{LINK_PATH}?t={secret}", "expiresAt": expires_at.isoformat()}
    return jsonify(answer), 201
