"""Accepting a transition: one transaction that locks the request and queues a PENDING execution."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, func, text

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
        execution_id = queue_execution(
            connection,
            request_row=row,
            transition_id=transition.id,
            actor=caller.sub,
            actor_snapshot=caller.snapshot(),
            max_attempts=max_attempts,
        )
    log.info(
        "transition accepted",
        extra={"request_id": str(row.id), "execution_id": str(execution_id)},
    )
    return execution_id


def queue_execution(
    connection: Connection,
    *,
    request_row: Row,
    transition_id: str,
    actor: str,
    actor_snapshot: dict[str, Any],
    max_attempts: int,
    simulation: bool = False,
) -> uuid.UUID:
    """Write an accepted transition inside the caller's transaction; return the execution id.

    The caller has locked the request (or just inserted it) and checked the transition:
    this queues the PENDING execution, moves the request to the next revision with the
    execution as its busy marker, records TRANSITION_ACCEPTED and wakes the workers.
    `request_row` needs id, org_id, flow_id, state and revision. Platform events and dry
    runs accept their first transition through here too.
    """
    accepted_revision = request_row.revision + 1
    execution_id = connection.execute(
        execution.insert()
        .values(
            request_id=request_row.id,
            org_id=request_row.org_id,
            flow_id=request_row.flow_id,
            transition_id=transition_id,
            status="PENDING",
            accepted_revision=accepted_revision,
            accepted_state=request_row.state,
            max_attempts=max_attempts,
            simulation=simulation,
            actor_snapshot=actor_snapshot,
        )
        .returning(execution.c.id)
    ).scalar_one()
    connection.execute(
        request.update()
        .where(request.c.id == request_row.id)
        .values(
            revision=accepted_revision,
            busy_execution_id=execution_id,
            updated_at=func.now(),
        )
    )
    connection.execute(
        audit_event.insert().values(
            org_id=request_row.org_id,
            kind="TRANSITION_ACCEPTED",
            request_id=request_row.id,
            execution_id=execution_id,
            actor=actor,
            detail={
                "transitionId": transition_id,
                "fromState": request_row.state,
                "acceptedRevision": accepted_revision,
            },
        )
    )
    # Delivered at commit, so a listening worker never sees an uncommitted row.
    connection.execute(text("SELECT pg_notify(:channel, '')"), {"channel": EXECUTION_READY_CHANNEL})
    return execution_id
