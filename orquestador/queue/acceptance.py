"""Accepting a transition: the request locked and checked, and a PENDING execution queued.

This is how work enters the queue, whoever asks: a person through the API, a platform
event, a dry run. `accept_transition` is the whole acceptance in one transaction;
`queue_execution` is its write, for callers that hold the request themselves (the
request they just created with `insert_request`, in the same transaction).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Row, func, text

from orquestador import tracing
from orquestador.db.schema import EXECUTION_READY_CHANNEL, audit_event, execution, request
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.statuses import ExecutionStatus
from orquestador.errors import Problem, Refusal

log = logging.getLogger(__name__)

# Finds the request and locks it for the write, with its pinned flow's definition and
# whether it is a dry run's, or None when the caller may not see it: who sees what is
# the caller's rule, not ours.
RequestLocker = Callable[[Connection, uuid.UUID], Row[Any] | None]


class RequestNow(Protocol):
    """What `queue_execution` reads of a request besides a locked row of it: the request
    as a finish just left it (a continuation)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def org_id(self) -> str: ...
    @property
    def flow_id(self) -> uuid.UUID: ...
    @property
    def state(self) -> str: ...
    @property
    def revision(self) -> int: ...
    @property
    def data(self) -> Any: ...


@dataclass(frozen=True)
class TransitionCommand:
    request_id: uuid.UUID
    transition_id: str
    expected_revision: int
    # 0-9; None: the flow's default.
    priority: int | None = None


class TransitionRefused(Refusal):
    """The transition cannot be accepted on the request as it is now."""

    code = "TRANSITION_REFUSED"

    def __init__(self, code: str, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message, code=code, problems=problems or ())


# The refusals' codes, stable: the API answers each with its own status.
REQUEST_NOT_FOUND = "NOT_FOUND"
TRANSITION_UNKNOWN = "TRANSITION_UNKNOWN"
REVISION_CONFLICT = "REVISION_CONFLICT"
REQUEST_BUSY = "REQUEST_BUSY"
TRANSITION_NOT_ALLOWED = "TRANSITION_NOT_ALLOWED"
CONCURRENCY_KEY_MISSING = "CONCURRENCY_KEY_MISSING"


def accept_transition(
    engine: Engine,
    command: TransitionCommand,
    *,
    lock_request: RequestLocker,
    actor: str,
    actor_snapshot: dict[str, Any],
    max_attempts: int,
) -> uuid.UUID:
    """Queue the transition and return the new execution's id, or raise `TransitionRefused`."""
    with (
        tracing.span(
            "transition.accept",
            {
                "orquestador.request_id": command.request_id,
                "orquestador.transition_id": command.transition_id,
            },
        ),
        engine.begin() as connection,
    ):
        # The row lock serializes every acceptance on this request: whoever waits
        # re-reads the revision and busy marker the winner left behind.
        row = lock_request(connection, command.request_id)
        # A dry run's request accepts only dry runs (POST /flows/{id}/dry-runs): to a
        # real transition it does not exist, whichever locker let it through.
        if row is None or row.simulation:
            raise TransitionRefused(REQUEST_NOT_FOUND, "The request does not exist.")
        definition = FlowDefinition.from_json(row.definition)
        transition = definition.transitions.get(command.transition_id)
        if transition is None:
            raise TransitionRefused(
                TRANSITION_UNKNOWN,
                "The request's flow has no such transition.",
                [Problem("/transition", "unknown transition id")],
            )
        if row.revision != command.expected_revision:
            raise TransitionRefused(
                REVISION_CONFLICT,
                f"The request is at revision {row.revision}; read it again and retry.",
            )
        if row.busy_execution_id is not None:
            raise TransitionRefused(
                REQUEST_BUSY,
                "The request has an unfinished execution; wait for it to finish.",
            )
        if not transition.leaves(row.state):
            raise TransitionRefused(
                TRANSITION_NOT_ALLOWED,
                f"The transition does not leave the request's current state {row.state!r}.",
                [Problem("/transition", f"does not leave state {row.state!r}")],
            )
        try:
            execution_id = queue_execution(
                connection,
                request_row=row,
                definition=definition,
                transition_id=transition.id,
                actor=actor,
                actor_snapshot=actor_snapshot,
                max_attempts=max_attempts,
                priority=command.priority,
            )
        except KeyMissing as missing:
            raise TransitionRefused(
                CONCURRENCY_KEY_MISSING,
                "The transition declares a concurrency key that the request data does not give.",
                [missing.problem],
            ) from None
        tracing.note("orquestador.execution_id", execution_id)
    log.info(
        "transition accepted",
        extra={"request_id": str(row.id), "execution_id": str(execution_id)},
    )
    return execution_id


def insert_request(
    connection: Connection,
    *,
    org: str,
    owner: str,
    flow_row: Row[Any],
    data: Any,
    machine_id: str | None,
    state: str | None = None,
    simulation: bool = False,
) -> Row[Any]:
    """Insert a request at revision 1 on the flow (data already checked); return its row.

    It starts in `state`, else the flow's initial state. The row carries what
    `request_view` and `queue_execution` read.
    """
    initial = FlowDefinition.from_json(flow_row.definition).initial_state
    return connection.execute(
        request.insert()
        .values(
            org_id=org,
            owner_id=owner,
            flow_id=flow_row.id,
            state=state or initial,
            revision=1,
            data=data,
            created_by=owner,
            machine_id=machine_id,
            simulation=simulation,
        )
        .returning(
            request.c.id,
            request.c.org_id,
            request.c.flow_id,
            request.c.state,
            request.c.revision,
            request.c.data,
            request.c.machine_id,
        )
    ).one()


def queue_execution(
    connection: Connection,
    *,
    request_row: Row[Any] | RequestNow,
    definition: FlowDefinition,
    transition_id: str,
    actor: str,
    actor_snapshot: dict[str, Any],
    max_attempts: int,
    priority: int | None = None,
    simulation: bool = False,
    rehearsal: dict[str, Any] | None = None,
    started_by: dict[str, Any] | None = None,
    continued_from: uuid.UUID | None = None,
    continuations: int = 0,
    parked_for: str | None = None,
    parent_execution_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Write an accepted transition inside the caller's transaction; return the execution id.

    The caller has locked the request (or just inserted it) and checked the transition:
    this queues the PENDING execution, moves the request to the next revision with the
    execution as its busy marker, records TRANSITION_ACCEPTED and wakes the workers.
    `request_row` needs id, org_id, flow_id, state, revision and data. Platform events and
    dry runs accept their first transition through here too.

    The execution's concurrency key is read from the request data before anything is
    written (`KeyMissing` when the data gives none); a dry run holds no key, so it never
    waits for a real execution nor makes one wait. `priority` None is the flow's default.
    `rehearsal`: a dry run's outcomes, played by its steps instead of their simulations.
    `started_by`: what asked for it when no person did (a schedule's fire, a platform
    event, a continuation), kept in the audit row: the actor is then only whom the start
    acts for. `continued_from` and `continuations`: the execution whose finish continues
    into this one, and how many continuations in a row led here (queue/continuations.py).
    `parked_for`: accepted RECONCILIATION_REQUIRED with this error code, for a person to
    let it run (retry) or not (fail), rather than PENDING. `parent_execution_id`: the
    rollout step's execution that starts this one as a child (rollouts/store.py).
    """
    concurrency = definition.transitions[transition_id].concurrency
    key: str | None = None
    limit: int | None = None
    if concurrency is not None and not simulation:
        key, limit = key_value(concurrency, request_row.data), concurrency.limit
    accepted_revision = request_row.revision + 1
    execution_id = connection.execute(
        execution.insert()
        .values(
            request_id=request_row.id,
            org_id=request_row.org_id,
            flow_id=request_row.flow_id,
            transition_id=transition_id,
            status=ExecutionStatus.PENDING
            if parked_for is None
            else ExecutionStatus.RECONCILIATION_REQUIRED,
            error_code=parked_for,
            accepted_revision=accepted_revision,
            accepted_state=request_row.state,
            max_attempts=max_attempts,
            simulation=simulation,
            actor_snapshot=actor_snapshot,
            priority=definition.priority if priority is None else priority,
            concurrency_key=key,
            concurrency_limit=limit,
            rehearsal=rehearsal,
            # The span current now (the acceptance's) is what the worker continues.
            trace_parent=tracing.current_traceparent(),
            continued_from=continued_from,
            continuations=continuations,
            parent_execution_id=parent_execution_id,
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
                **({} if started_by is None else {"startedBy": started_by}),
            },
        )
    )
    # Delivered at commit, so a listening worker never sees an uncommitted row.
    connection.execute(text("SELECT pg_notify(:channel, '')"), {"channel": EXECUTION_READY_CHANNEL})
    return execution_id
