"""The quotas the API checks before it accepts work, each refusal a 429 naming its quota."""

from __future__ import annotations

import math

from flask import current_app

from orquestador.actions.contracts import RateLimit
from orquestador.api.context import api_context, engine
from orquestador.api.problems import ApiProblem
from orquestador.errors import Problem
from orquestador.queue.open_executions import RecentRoom
from orquestador.queue.rate_limits import take_token

# The organization's bucket among the routes' (table rate_bucket); no route name has a colon.
TRANSITIONS_BUCKET = "org-transitions:"
# When to ask again once the organization has as many open executions as it may: they
# end at the pace of its flows, which no one here knows.
OPEN_EXECUTIONS_RETRY_SECONDS = 30
# The app's RecentRoom (the organizations it found far below their limit, lately).
ROOM_KEY = "orquestador.open_execution_room"


def require_transition_token(org: str) -> None:
    """Take one of the organization's transition tokens, or answer 429 with Retry-After.

    A token bucket in the database (`rate_bucket`), so every API process draws on the
    same one: `transitionsPerSecond` on average, `transitionsBurst` at once. Taken before
    the transition's own transaction, so a refused transition still counts: the quota is
    on what is asked for.
    """
    quotas = api_context().settings.quotas_for(org)
    if quotas.transitions_per_second == 0 or quotas.transitions_burst == 0:
        wait: float | None = 60.0
    else:
        limit = RateLimit(
            per_second=float(quotas.transitions_per_second), burst=quotas.transitions_burst
        )
        with engine().connect() as conn:
            wait = take_token(conn, f"{TRANSITIONS_BUCKET}{org}", limit)
    if wait is None:
        return
    raise ApiProblem(
        429,
        "QUOTA_EXCEEDED",
        f"The organization's quota transitionsPerSecond ({quotas.transitions_per_second} a "
        f"second, {quotas.transitions_burst} at once) is used up: ask again after Retry-After "
        "seconds.",
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
    )


def require_open_execution_room(org: str) -> None:
    """Answer 429 with Retry-After when the organization has as many executions not
    ended as its quota openExecutions allows.

    Counted after the transition's token is taken (the bucket bounds how often this runs)
    and before the acceptance's transaction; queue/open_executions.py says by how much
    acceptances at the same moment may go over. An organization far below its limit is
    counted at most once a second per app (queue.open_executions.RecentRoom).
    """
    limit = api_context().settings.quotas_for(org).open_executions
    room: RecentRoom = current_app.extensions.setdefault(ROOM_KEY, RecentRoom())
    with engine().connect() as conn:
        used = room.used_if_full(conn, org, limit)
    if used is not None:
        raise open_executions_exceeded(limit, used)


def open_executions_exceeded(limit: int, used: int) -> ApiProblem:
    return ApiProblem(
        429,
        "QUOTA_EXCEEDED",
        f"The organization's quota openExecutions ({limit}) is used up: {used} executions "
        "have not ended. Ask again after Retry-After seconds, once some have ended.",
        problems=[Problem("", f"quota openExecutions: {used} of {limit}")],
        headers={"Retry-After": str(OPEN_EXECUTIONS_RETRY_SECONDS)},
    )
