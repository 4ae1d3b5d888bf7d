"""Problem details (RFC 9457): the one shape of every API error, and the handlers that emit it.

A route raises what went wrong in the product's own words (a `Refusal`, errors.py) and
never translates it: `REFUSAL_STATUS` below is the one table from a refusal to its HTTP
status, and `refusal_problem` the one translation, registered as the app's handler.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from flask import Flask, Response, g
from sqlalchemy.exc import DBAPIError
from werkzeug.exceptions import HTTPException

from orquestador.automation.plans import TriggerMismatch
from orquestador.automation.schedules import QuotaExceeded, ScheduleRefused
from orquestador.db.engine import is_retriable
from orquestador.errors import (
    DatabaseUnavailable,
    DecisionInvalid,
    NotCancellable,
    NotReconcilable,
    Problem,
    Refusal,
)
from orquestador.machines.commands import StatusConflict
from orquestador.problems import PROBLEM_MEDIA_TYPE, code_for_status, problem_document
from orquestador.queue import acceptance
from orquestador.rollouts.control import RolloutRefused

log = logging.getLogger(__name__)


class ApiProblem(Exception):
    """An error the API answers with a problem body; raise it from any view."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str | None = None,
        *,
        problems: Iterable[Problem] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail or code)
        self.status = status
        self.code = code
        self.detail = detail
        self.problems = list(problems)
        self.headers = dict(headers or {})

    def response(self) -> Response:
        return problem_response(
            self.status, self.code, self.detail, problems=self.problems, headers=self.headers
        )


def problem_response(
    status: int,
    code: str,
    detail: str | None = None,
    *,
    problems: Iterable[Problem] = (),
    headers: Mapping[str, str] | None = None,
) -> Response:
    body = problem_document(status, code, detail, problems=problems)
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_MEDIA_TYPE)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def not_found() -> ApiProblem:
    """The one 404: missing, foreign and malformed ids and unknown paths all look alike."""
    return ApiProblem(404, "NOT_FOUND", "The resource does not exist or is not visible to you.")


# The one table of the API's refusals: a refusal's status is its nearest class's here
# (a code in REFUSAL_CODE_STATUS says more than its class); a NOT_FOUND one is the one 404.
REFUSAL_STATUS: dict[type[Refusal], int] = {
    Refusal: 422,
    NotReconcilable: 409,  # the execution is not parked for this (StaleItem too)
    NotCancellable: 409,
    StatusConflict: 409,
    RolloutRefused: 409,  # the rollout's state does not allow it now
    DecisionInvalid: 422,
    acceptance.TransitionRefused: 422,
    ScheduleRefused: 422,
    QuotaExceeded: 422,
    TriggerMismatch: 422,
}
REFUSAL_CODE_STATUS: dict[str, int] = {
    acceptance.REVISION_CONFLICT: 409,
    acceptance.REQUEST_BUSY: 409,
}


def refusal_status(refused: Refusal) -> int:
    if refused.code in REFUSAL_CODE_STATUS:
        return REFUSAL_CODE_STATUS[refused.code]
    return next(REFUSAL_STATUS[kind] for kind in type(refused).__mro__ if kind in REFUSAL_STATUS)


def refusal_problem(refused: Refusal) -> ApiProblem:
    """The problem the API answers a refusal with (its handler; the pages ask it too)."""
    if refused.code == Refusal.NOT_FOUND:
        # A foreign thing and a missing one look alike.
        return not_found()
    problems = (
        _decision_problems(refused) if isinstance(refused, DecisionInvalid) else refused.problems
    )
    return ApiProblem(refusal_status(refused), refused.code, refused.detail, problems=problems)


def as_problem(error: ApiProblem | Refusal) -> ApiProblem:
    """What a page that shows a refusal beside its form reads, whichever shape it came in."""
    return error if isinstance(error, ApiProblem) else refusal_problem(error)


def _decision_problems(invalid: DecisionInvalid) -> list[Problem]:
    if invalid.code == "OUTPUT_INVALID":
        # The protocol points into the output; the answer points into the body, with the
        # validator's words that the reconcile route kept (the output is the operator's).
        messages: dict[str, str] = g.get("output_messages", {})
        return [
            Problem(f"/output{path}", messages.get(path, invalid.message))
            for path in invalid.paths or [""]
        ]
    if invalid.problems:
        return invalid.problems
    return [Problem(path, invalid.message) for path in invalid.paths]


def _http_exception(error: HTTPException) -> Response:
    status = error.code or 500
    if status == 404:
        return not_found().response()
    headers: dict[str, str] = {}
    if status == 405:
        # Keep the Allow header werkzeug computed for the route.
        allow = dict(error.get_headers()).get("Allow")
        if allow:
            headers["Allow"] = allow
    if status == 413:
        detail = "The request body is larger than the server accepts."
    elif status >= 500:
        detail = None
    else:
        detail = error.description
    return problem_response(status, code_for_status(status), detail, headers=headers)


def _database_error(error: DBAPIError) -> Response:
    if is_retriable(error):
        log.warning("database unavailable while serving a request: %s", type(error).__name__)
        return problem_response(
            503,
            DatabaseUnavailable.code,
            "The database is unavailable; try again shortly.",
            headers={"Retry-After": "1"},
        )
    return _unexpected(error)


def _database_unavailable(error: DatabaseUnavailable) -> Response:
    log.warning("database unavailable: %s", error.message)
    return problem_response(
        503,
        error.code,
        "The database is unavailable; try again shortly.",
        headers={"Retry-After": "1"},
    )


def _unexpected(error: Exception) -> Response:
    # The engine hides bound parameters, so the traceback carries no request data;
    # the client gets nothing but the code.
    log.error("unhandled %s while serving a request", type(error).__name__, exc_info=error)
    return problem_response(500, "INTERNAL", "An internal error occurred.")


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(ApiProblem, lambda error: error.response())
    app.register_error_handler(Refusal, lambda error: refusal_problem(error).response())
    app.register_error_handler(HTTPException, _http_exception)
    app.register_error_handler(DatabaseUnavailable, _database_unavailable)
    app.register_error_handler(DBAPIError, _database_error)
    app.register_error_handler(Exception, _unexpected)
