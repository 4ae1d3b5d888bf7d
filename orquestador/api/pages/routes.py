"""The execution pages for people: server-rendered HTML, signed in with a cookie.

A person pastes a token at /ui/login; it is verified with the API's own verifier and
kept in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) that only /ui paths
receive. Signing out records the token as signed out on the server (page_sessions), so
no copy of the cookie opens a page again. Every page reads through ResourceAccess
exactly as the JSON API does, so a foreign execution is the same "not found" as a
missing one. Pages carry no script at all and a strict Content-Security-Policy;
templates are autoescaped, so names written by flow authors (states, transitions,
keys) always show as text.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, TypeVar

from flask import Blueprint, Response, g, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException

from orquestador.api.access import ResourceAccess
from orquestador.api.auth import SIGNED_OUT, Caller, InvalidToken
from orquestador.api.claims import (
    SCOPE_EXECUTIONS_CANCEL,
    SCOPE_EXECUTIONS_RECONCILE,
    SCOPE_REQUESTS_READ,
)
from orquestador.api.context import api_context, engine
from orquestador.api.execution_routes import (
    execution_filter,
    read_execution,
    read_view_facts,
)
from orquestador.api.page_sessions import revoke_session, session_revoked
from orquestador.api.pages.execution_page import page_context
from orquestador.api.pages.forms import (
    CSRF_FIELD,
    csrf_token,
    over_https,
    require_csrf,
    require_same_origin,
)
from orquestador.api.paging import cursor, query_problem
from orquestador.api.problems import ApiProblem, refusal_problem
from orquestador.api.sign_in_links import SESSION_SECONDS, landing_page, use_link
from orquestador.api.tokens import mint_token, page_audience
from orquestador.api.views import execution_views
from orquestador.db.schema import EXECUTION_STATUSES
from orquestador.domain.statuses import ExecutionStatus
from orquestador.errors import ConfigError, Refusal
from orquestador.notices.vocabulary import email_outcome_in_words
from orquestador.wording import command_status_meaning, duration_in_words

log = logging.getLogger(__name__)

blueprint = Blueprint(
    "ui",
    __name__,
    url_prefix="/ui",
    static_folder="static",
    static_url_path="/static",
    template_folder="templates",
)

SESSION_COOKIE = "orquestador_session"
# A sign-in link's session until it is taken (see sign_in_link): only its own paths get it.
LINK_COOKIE = "orquestador_link_session"
LINK_COOKIE_PATH = "/ui/auth/link"
LINK_SESSION_KEPT_SECONDS = 600
# A browser keeps at most about 4 KiB per cookie: a longer token could not be kept.
MAX_TOKEN_CHARACTERS = 3800

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

# The filter links of the list, in the order a person looks for them.
STATUS_LINKS = (
    (ExecutionStatus.RECONCILIATION_REQUIRED, "Reconciliation queue"),
    (ExecutionStatus.WAITING, "Waiting"),
    (ExecutionStatus.RETRY_WAIT, "Retry wait"),
    (ExecutionStatus.PENDING, "Pending"),
    (ExecutionStatus.RUNNING, "Running"),
    (ExecutionStatus.FAILED, "Failed"),
    (ExecutionStatus.SUCCEEDED, "Succeeded"),
    (ExecutionStatus.CANCELLED, "Cancelled"),
)

F = TypeVar("F", bound=Callable[..., Any])


# --- signing in ----------------------------------------------------------------------


def _cookie_caller() -> Caller | None:
    token = request.cookies.get(SESSION_COOKIE)
    if not token or len(token) > MAX_TOKEN_CHARACTERS:
        return None
    try:
        return _page_caller(token)
    except InvalidToken as refused:
        # The reason is for operators; the token itself is never logged.
        log.info("refused a session cookie: %s", refused)
        return None


def _page_caller(token: str) -> Caller:
    """The caller a token names, unless it was refused or signed out of the pages."""
    caller = api_context().verifier.verify(token, for_pages=True)
    with engine().connect() as conn:
        if session_revoked(conn, token):
            raise InvalidToken(SIGNED_OUT)
    return caller


def _safe_next(target: str | None) -> str:
    """Where to go after signing in: only a page of this UI, never another site."""
    return landing_page(target) or url_for("ui.executions")


def signed_in(view: F) -> F:
    """Demand a signed-in person who may read executions; the caller lands in `g.caller`."""

    @functools.wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        caller = _cookie_caller()
        if caller is None:
            target = request.full_path if request.query_string else request.path
            response = redirect(url_for("ui.login", next=target), 303)
            if SESSION_COOKIE in request.cookies:
                _forget(response)  # expired or refused: no use sending it again
            return response
        if not caller.has_scope(SCOPE_REQUESTS_READ):
            raise ApiProblem(
                403,
                "INSUFFICIENT_SCOPE",
                f"Your token does not allow reading executions ({SCOPE_REQUESTS_READ}).",
            )
        g.caller = caller
        return view(*args, **kwargs)

    return guarded  # type: ignore[return-value]


def page_action(view: F) -> F:
    """A page form's POST: sent from a page of this server, by a signed-in person, with
    the session's CSRF token. The caller lands in `g.caller`; each action checks its scope.
    """

    @functools.wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        require_same_origin()
        caller = _cookie_caller()
        if caller is None:
            raise ApiProblem(
                401, "SIGNED_OUT", "Your page session has ended: sign in again, then repeat."
            )
        require_csrf(request.cookies[SESSION_COOKIE])
        g.caller = caller
        return view(*args, **kwargs)

    return guarded  # type: ignore[return-value]


def require_page_scope(*scopes: str, what: str = "this") -> None:
    """The 403 page unless the person's token holds one of `scopes`."""
    if not any(g.caller.has_scope(scope) for scope in scopes):
        held = " or ".join(scopes)
        raise ApiProblem(403, "INSUFFICIENT_SCOPE", f"Your token does not allow {what} ({held}).")


@blueprint.app_context_processor
def _form_token() -> dict[str, Any]:
    """`csrf`: the token this page session's forms carry (empty when signed out)."""
    token = request.cookies.get(SESSION_COOKIE) if request else None
    return {"csrf_field": CSRF_FIELD, "csrf": csrf_token(token) if token else ""}


def _keep_session(response: Response, token: str) -> None:
    """The page session's cookie: never for scripts, never sent by another site's page."""
    response.set_cookie(
        SESSION_COOKIE,
        token,
        path="/ui",
        secure=over_https(),
        httponly=True,
        samesite="Strict",
    )


def _forget(response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path="/ui",
        secure=over_https(),
        httponly=True,
        samesite="Strict",
    )


@blueprint.get("/login")
def login() -> Any:
    if _cookie_caller() is not None:
        return redirect(_safe_next(request.args.get("next")), 303)
    return render_template("login.html", next=_safe_next(request.args.get("next")), error=None)


@blueprint.post("/login")
def login_submit() -> Any:
    require_same_origin()
    token = request.form.get("token", "").strip()
    next_page = _safe_next(request.form.get("next"))
    error, status = None, 200
    caller: Caller | None = None
    if not token:
        error, status = "Paste a token to sign in.", 400
    elif len(token) > MAX_TOKEN_CHARACTERS:
        error, status = "That token is too long to be kept by a browser.", 400
    else:
        try:
            caller = _page_caller(token)
        except InvalidToken as refused:
            log.info("refused a sign-in token: %s", refused)
            error, status = "That token was not accepted: it is invalid or has expired.", 401
            if str(refused) == SIGNED_OUT:
                error = "That token was signed out of these pages: sign in with a new one."
        else:
            if not caller.has_scope(SCOPE_REQUESTS_READ):
                error, status = (
                    f"That token does not allow reading executions ({SCOPE_REQUESTS_READ}).",
                    403,
                )
    if error is not None:
        page = render_template("login.html", next=next_page, error=error)
        return Response(page, status=status, mimetype="text/html")
    assert caller is not None
    log.info("signed in to the execution pages", extra={"org": caller.org})
    response = redirect(next_page, 303)
    _keep_session(response, token)
    return response


@blueprint.get("/auth/link")
def sign_in_link() -> Any:
    """A hosting panel's one-time link: a session for whom it names, held until it is taken.

    The person arrives from the panel's site, where the browser sends no SameSite=Strict
    cookie: who is signed in here cannot be told yet. So the link's session goes in a
    cookie of its own, and the answer is a page that moves on by itself (not a redirect,
    which would still count as coming from the panel) to where it is taken.
    """
    with engine().begin() as conn:
        link = use_link(conn, request.args.get("t", ""))
    if link is None:
        raise ApiProblem(
            410,
            "LINK_USED_OR_EXPIRED",
            "This sign-in link was used already or has expired: ask for a new one.",
        )
    try:
        token = mint_token(
            api_context().settings,
            sub=link.subject,
            org=link.org_id,
            scopes=link.scope.split(),
            ttl_seconds=SESSION_SECONDS,
            audience=page_audience(api_context().settings),
        )
    except ConfigError:
        raise ApiProblem(
            503, "NO_SIGNING_KEY", "This server holds no key to sign page sessions with."
        ) from None
    log.info("sign-in link used", extra={"org": link.org_id})
    onward = url_for("ui.take_link_session", next=link.next_page)
    page = render_template("link.html", next=onward)
    response = Response(page, status=200, mimetype="text/html")
    response.set_cookie(
        LINK_COOKIE,
        token,
        max_age=LINK_SESSION_KEPT_SECONDS,
        path=LINK_COOKIE_PATH,
        secure=over_https(),
        httponly=True,
        samesite="Strict",
    )
    return response


def _link_caller() -> tuple[str, Caller]:
    """The session a sign-in link left in its own cookie, and whom it names."""
    token = request.cookies.get(LINK_COOKIE, "")
    caller = None
    if token and len(token) <= MAX_TOKEN_CHARACTERS:
        try:
            caller = _page_caller(token)
        except InvalidToken as refused:
            log.info("refused a sign-in link's session: %s", refused)
    if caller is None:
        raise ApiProblem(
            410,
            "LINK_USED_OR_EXPIRED",
            "This sign-in link was used already or has expired: ask for a new one.",
        )
    return token, caller


def _take_link_session(token: str, caller: Caller, next_page: str) -> Response:
    log.info("signed in by a link", extra={"org": caller.org})
    response = redirect(next_page, 303)
    _keep_session(response, token)
    response.delete_cookie(
        LINK_COOKIE, path=LINK_COOKIE_PATH, secure=over_https(), httponly=True, samesite="Strict"
    )
    return response


@blueprint.get("/auth/link/continue")
def take_link_session() -> Any:
    """Where a sign-in link moves on to: the link's session becomes the page session, unless
    a different person is signed in, whom it never replaces without asking."""
    token, caller = _link_caller()
    next_page = _safe_next(request.args.get("next"))
    current = _cookie_caller()
    if current is None or (current.sub, current.org) == (caller.sub, caller.org):
        return _take_link_session(token, caller, next_page)
    page = render_template(
        "link_confirm.html",
        current=current,
        arriving=caller,
        next=next_page,
        link_csrf=csrf_token(token),
    )
    return Response(page, status=200, mimetype="text/html")


@blueprint.post("/auth/link/continue")
def confirm_link_session() -> Any:
    """The person chose to continue as the link's person: only from a page of this server."""
    require_same_origin()
    require_csrf(request.cookies.get(LINK_COOKIE, ""))
    token, caller = _link_caller()
    return _take_link_session(token, caller, _safe_next(request.form.get("next")))


@blueprint.post("/logout")
def logout() -> Any:
    require_same_origin()
    token = request.cookies.get(SESSION_COOKIE)
    caller = _cookie_caller()
    if token and caller is not None and caller.expires_at is not None:
        # Forgetting the cookie is not enough: a copy of it (another tab's, a stolen one)
        # would still sign in. The record lasts as long as the token could be accepted.
        with engine().begin() as conn:
            revoke_session(
                conn,
                token,
                org_id=caller.org,
                subject=caller.sub,
                expires_at=caller.expires_at + api_context().settings.jwt_leeway_seconds,
            )
        log.info("signed out of the execution pages", extra={"org": caller.org})
    response = redirect(url_for("ui.login"), 303)
    _forget(response)
    return response


# --- pages ---------------------------------------------------------------------------


@blueprint.get("")
@blueprint.get("/")
def home() -> Any:
    return redirect(url_for("ui.executions"), 303)


@blueprint.get("/executions")
@signed_in
def executions() -> Any:
    kept = search_arguments()
    try:
        page = replace(execution_filter(_filter_arguments(kept)), sort=_list_order(kept))
    except ApiProblem as refused:
        if refused.status != 400:
            raise
        # The person's own search, shown again with what is wrong with it.
        return _executions_page(
            kept, items=[], next_url=None, problems=refused.problems, status=400
        )
    access = ResourceAccess(g.caller)
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            rows = access.list_executions(connection, page)
            more, rows = len(rows) > page.limit, rows[: page.limit]
            ids = [row.id for row in rows]
            steps = access.steps_of(connection, ids) if ids else []
            attempts = access.attempts_of(connection, ids) if ids else []
            facts = read_view_facts(connection, access, ids, steps)
    if page.id_prefix is not None and len(rows) == 1 and page.after is None:
        # An id, or a short id only one execution starts with: that execution's page.
        return redirect(url_for("ui.execution_page", execution_id=str(rows[0].id)), 303)
    views = execution_views(rows, steps, attempts, facts)
    items = [page_facts(row, view) for row, view in zip(rows, views, strict=True)]
    next_url = None
    if more and page.sort == "created":
        next_url = url_for("ui.executions", **kept, after=cursor(rows[-1]))
    return _executions_page(kept, items=items, next_url=next_url, problems=[], status=200)


# How the list is ordered: by creation (newest first, page after page), or by how long
# each ran (the longest first: the first page only).
LIST_ORDERS = ("created", "duration")


def _list_order(kept: dict[str, str]) -> str:
    order = kept.get("sort", "created")
    if order not in LIST_ORDERS:
        raise query_problem("sort", "created (newest first) or duration (longest first)")
    if order == "duration" and request.args.get("after") is not None:
        raise query_problem("after", "the longest executions are one page: narrow the search")
    return order


# The search form's fields, by their query parameters (the JSON listing's own names).
SEARCH_FIELDS = (
    "id",
    "machineId",
    "flowKey",
    "errorCode",
    "createdAfter",
    "createdBefore",
    "parentExecutionId",
)
# What a person is told about a time they typed that is not one.
_TIME_EXAMPLE = "a date and time such as 2026-03-01T09:30 (UTC), or with its offset"


def search_arguments() -> dict[str, str]:
    """The list's filters as the person gave them, empty fields left out: every link of
    the list (status, dry runs, older executions) keeps them."""
    kept: dict[str, str] = {}
    for name in (*SEARCH_FIELDS, "status", "simulation", "limit", "sort"):
        value = request.args.get(name, "").strip()
        if value:
            kept[name] = value
    return kept


def _filter_arguments(kept: dict[str, str]) -> dict[str, str]:
    """The filters as the JSON listing reads them: a time without an offset (what a
    browser's date-time field sends) is UTC; a cursor comes along when given."""
    arguments = dict(kept)
    for name in ("createdAfter", "createdBefore"):
        if name in arguments:
            arguments[name] = _utc_instant(arguments[name])
    after = request.args.get("after")
    if after is not None:
        arguments["after"] = after
    return arguments


def _utc_instant(text: str) -> str:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text  # left as typed: the filter refuses it and says why
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


# The list's filters a bulk action takes too (by the same names).
BULK_CRITERIA = ("status", "flowKey", "machineId", "errorCode", "createdAfter", "createdBefore")


def _bulk_url(kept: dict[str, str]) -> str | None:
    """The bulk preview of exactly what this search finds, for a person who may act in
    bulk; None when the search has a criterion a bulk action cannot take (an id, dry
    runs) or none at all."""
    if not (
        g.caller.has_scope(SCOPE_EXECUTIONS_CANCEL)
        or g.caller.has_scope(SCOPE_EXECUTIONS_RECONCILE)
    ):
        return None
    # A rollout's children are not a bulk criterion: the bulk would take more than shown.
    if {"id", "simulation", "parentExecutionId"} & kept.keys():
        return None
    criteria = {name: kept[name] for name in BULK_CRITERIA if name in kept}
    for name in ("createdAfter", "createdBefore"):
        if name in criteria:
            criteria[name] = _utc_instant(criteria[name])
    return url_for("ui.bulk_preview", **criteria) if criteria else None


def _executions_page(
    kept: dict[str, str],
    *,
    items: list[dict[str, Any]],
    next_url: str | None,
    problems: list[Any],
    status: int,
) -> Response:
    others = {name: value for name, value in kept.items() if name not in ("status", "simulation")}
    chosen = kept.get("status")
    simulation = kept.get("simulation") == "true"
    status_links = [
        (
            label,
            url_for("ui.executions", **others, status=value),
            chosen == value and not simulation,
        )
        for value, label in STATUS_LINKS
    ]
    page = render_template(
        "executions.html",
        caller=g.caller,
        items=items,
        status=chosen,
        simulation=simulation,
        searched=kept.get("id", ""),
        search=kept,
        searching=any(name in kept for name in SEARCH_FIELDS),
        statuses=EXECUTION_STATUSES,
        all_url=url_for("ui.executions", **others),
        dry_runs_url=url_for("ui.executions", **others, simulation="true"),
        status_links=status_links,
        next_url=next_url,
        sort=kept.get("sort", "created"),
        sort_urls={
            order: url_for(
                "ui.executions",
                **{name: value for name, value in kept.items() if name != "sort"},
                **({"sort": order} if order != "created" else {}),
            )
            for order in LIST_ORDERS
        },
        bulk_url=_bulk_url(kept) if items else None,
        problems=[
            {
                "path": problem.path,
                "message": _TIME_EXAMPLE
                if problem.path in ("/createdAfter", "/createdBefore")
                else problem.message,
            }
            for problem in problems
        ],
    )
    return Response(page, status=status, mimetype="text/html")


@blueprint.get("/executions/<execution_id>")
@signed_in
def execution_page(execution_id: str) -> Any:
    identifier = page_id(execution_id)
    found = read_execution(ResourceAccess(g.caller), identifier, for_page=True)
    if found is None:
        raise not_found_page()
    context = page_context(found, g.caller)
    page = render_template(
        "execution.html",
        caller=g.caller,
        execution=page_facts(found.row, found.view),
        **context,
    )
    response = Response(page, mimetype="text/html")
    if context["refresh_seconds"]:
        # Not final: the page follows the execution by itself (no script needed).
        response.headers["Refresh"] = str(context["refresh_seconds"])
    return response


@blueprint.get("/<path:anything>")
def unknown(anything: str) -> Any:
    raise not_found_page()


def page_id(text: str) -> uuid.UUID:
    """The id a page's path names; a malformed one is the same 404 as a missing one."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise not_found_page() from None


def not_found_page() -> ApiProblem:
    # One answer for a foreign, a missing and a malformed id: nothing to tell them apart.
    return ApiProblem(404, "NOT_FOUND", "There is no such page, or you may not see it.")


def page_facts(row: Any, view: dict[str, Any]) -> dict[str, Any]:
    """The view plus what a person reads it by: the flow's key and the state it left,
    when it started (its first claim), how long it ran (to its end, or to now) and who
    started it."""
    started = getattr(row, "started_at", None)
    finished = getattr(row, "finished_at", None)
    ran = None
    if started is not None:
        ran = max(0, int(((finished or datetime.now(UTC)) - started).total_seconds()))
    return {
        **view,
        "flowKey": row.flow_key,
        "flowVersion": row.flow_version,
        "fromState": row.accepted_state,
        "startedAt": started.isoformat() if started is not None else None,
        "runSeconds": ran,
        "running": started is not None and finished is None,
        "startedBy": getattr(row, "started_by", None),
    }


# --- answers -------------------------------------------------------------------------


@blueprint.errorhandler(ApiProblem)
def _problem_page(problem: ApiProblem) -> Response:
    page = render_template(
        "error.html",
        caller=g.get("caller"),
        status=problem.status,
        title=HTTPStatus(problem.status).phrase,
        detail=problem.detail,
        problems=problem.problems,
    )
    return Response(page, status=problem.status, mimetype="text/html")


@blueprint.errorhandler(Refusal)
def _refusal_page(refused: Refusal) -> Response:
    return _problem_page(refusal_problem(refused))


@blueprint.errorhandler(HTTPException)
def _http_error_page(error: HTTPException) -> Response:
    # What werkzeug raises inside a page (a form over the size limit, say).
    status = error.code or 500
    page = render_template(
        "error.html",
        caller=g.get("caller"),
        status=status,
        title=HTTPStatus(status).phrase,
        detail=None,
        problems=[],
    )
    return Response(page, status=status, mimetype="text/html")


@blueprint.after_request
def _page_headers(response: Response) -> Response:
    # No script, no inline style, no frames, forms only to this server.
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Frame-Options"] = "DENY"
    # Same-origin: the sign-in form's Origin check still has what it needs.
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    return response


@blueprint.app_template_filter("when")
def _when(value: str | None) -> str:
    """An API timestamp as a person reads it, in UTC to the second."""
    if not value:
        return "—"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@blueprint.app_template_filter("in_words")
def _in_words(seconds: int | None) -> str:
    return "—" if seconds is None else duration_in_words(seconds)


@blueprint.app_template_filter("email_words")
def _email_words(outcome: Any) -> str:
    """What became of a notice's e-mail, in words."""
    return email_outcome_in_words(outcome)


@blueprint.app_template_filter("command_meaning")
def _command_meaning(status: Any) -> str:
    """What a machine command's status means, in words ('' when the word says it)."""
    return command_status_meaning(status) if isinstance(status, str) else ""


@blueprint.app_template_filter("as_text")
def _as_text(value: Any) -> str:
    """Any JSON value as plain text (the template escapes it)."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
