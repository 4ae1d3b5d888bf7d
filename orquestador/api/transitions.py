"""Accepting a transition: one transaction that locks the request and queues a PENDING execution."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, func, text

from orquestador.api.access import ResourceAccess
from orquestador.api.problems import ApiProblem, not_found
from orquestador.db.schema import EXECUTION_READY_CHANNEL, audit_event, execution, request
from orquestador.domain.errors import Problem
from orquestador.domain.flow_definition import FlowDefinition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransitionCommand:
    request_id: uuid.UUID
    transition_id: str
    expected_revision: int


def accept_transition(
    engine: Engine, access: ResourceAccess, command: TransitionCommand, *, max_attempts: int
) -> uuid.UUID:
    """Queue the transition and return the new execution's id, or raise the 404/409/422 problem."""
    caller = access.caller
    with engine.begin() as connection:
        # The row lock serializes every acceptance on this request: whoever waits
        # re-reads the revision and busy marker the winner left behind.
        row = access.lock_request(connection, command.request_id)
        if row is None:
            raise not_found()
        transition = FlowDefinition.from_json(row.definition).transitions.get(command.transition_id)
        if transition is None:
            raise ApiProblem(
                422,
                "TRANSITION_UNKNOWN",
                "The request's flow has no such transition.",
                problems=[Problem("/transition", "unknown transition id")],
            )
        if row.revision != command.expected_revision:
            raise ApiProblem(
                409,
                "REVISION_CONFLICT",
                f"The request is at revision {row.revision}; read it again and retry.",
            )
        if row.busy_execution_id is not None:
            raise ApiProblem(
                409,
                "REQUEST_BUSY",
                "The request has an unfinished execution; wait for it to finish.",
            )
        if not transition.leaves(row.state):
            raise ApiProblem(
                422,
                "TRANSITION_NOT_ALLOWED",
                f"The transition does not leave the request's current state {row.state!r}.",
                problems=[Problem("/transition", f"does not leave state {row.state!r}")],
            )
        accepted_revision = row.revision + 1
        execution_id = connection.execute(
            execution.insert()
            .values(
                request_id=row.id,
                org_id=row.org_id,
                flow_id=row.flow_id,
                transition_id=transition.id,
                status="PENDING",
                accepted_revision=accepted_revision,
                accepted_state=row.state,
                max_attempts=max_attempts,
                # Dry runs are refused before this point until they exist.
                simulation=False,
                actor_snapshot=caller.snapshot(),
            )
            .returning(execution.c.id)
        ).scalar_one()
        connection.execute(
            request.update()
            .where(request.c.id == row.id)
            .values(
                revision=accepted_revision,
                busy_execution_id=execution_id,
                updated_at=func.now(),
            )
        )
        connection.execute(
            audit_event.insert().values(
                org_id=row.org_id,
                kind="TRANSITION_ACCEPTED",
                request_id=row.id,
                execution_id=execution_id,
                actor=caller.sub,
                detail={
                    "transitionId": transition.id,
                    "fromState": row.state,
                    "acceptedRevision": accepted_revision,
                },
            )
        )
        # Delivered at commit, so a listening worker never sees an uncommitted row.
        connection.execute(
            text("SELECT pg_notify(:channel, '')"), {"channel": EXECUTION_READY_CHANNEL}
        )
    log.info(
        "transition accepted",
        extra={"request_id": str(row.id), "execution_id": str(execution_id)},
    )
    return execution_id
