"""Accepting a transition over HTTP: the caller's reach, and each refusal as its problem."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine

from orquestador.api.access import ResourceAccess
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.quota_checks import require_open_execution_room, require_transition_token
from orquestador.queue import acceptance
from orquestador.queue.acceptance import TransitionCommand, TransitionRefused

# The status each refusal is answered with (a run's are the same).
REFUSAL_STATUS = {
    acceptance.TRANSITION_UNKNOWN: 422,
    acceptance.REVISION_CONFLICT: 409,
    acceptance.REQUEST_BUSY: 409,
    acceptance.TRANSITION_NOT_ALLOWED: 422,
    acceptance.CONCURRENCY_KEY_MISSING: 422,
}


def accept_transition(
    engine: Engine, access: ResourceAccess, command: TransitionCommand, *, max_attempts: int
) -> uuid.UUID:
    """Queue the transition and return the new execution's id, or raise the 404/409/422 problem."""
    caller = access.caller
    require_transition_token(caller.org)
    require_open_execution_room(caller.org)
    try:
        return acceptance.accept_transition(
            engine,
            command,
            lock_request=access.lock_request,
            actor=caller.sub,
            actor_snapshot=caller.snapshot(),
            max_attempts=max_attempts,
        )
    except TransitionRefused as refused:
        if refused.code == acceptance.REQUEST_NOT_FOUND:
            # A foreign request and a missing one look alike.
            raise not_found() from None
        raise ApiProblem(
            REFUSAL_STATUS[refused.code], refused.code, refused.message, problems=refused.problems
        ) from None
