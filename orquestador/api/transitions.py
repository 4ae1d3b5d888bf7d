"""Accepting a transition over HTTP: the caller's reach and quota, then the queue's acceptance."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine

from orquestador.api.access import ResourceAccess
from orquestador.api.quota_checks import require_open_execution_room, require_transition_token
from orquestador.queue import acceptance
from orquestador.queue.acceptance import TransitionCommand


def accept_transition(
    engine: Engine, access: ResourceAccess, command: TransitionCommand, *, max_attempts: int
) -> uuid.UUID:
    """Queue the transition and return the new execution's id, or raise TransitionRefused
    (answered by the app's one refusal handler, api/problems.py)."""
    caller = access.caller
    require_transition_token(caller.org)
    require_open_execution_room(caller.org)
    return acceptance.accept_transition(
        engine,
        command,
        lock_request=access.lock_request,
        actor=caller.sub,
        actor_snapshot=caller.snapshot(),
        max_attempts=max_attempts,
    )
