"""A finish that continues: the request moved into a state the flow continues from
(`"continue": {"STATE": "TRANSITION_ID"}`), and the named transition accepted in the
finish's own transaction.

Exactly once: the continuation is written in the same transaction as the finish, after
the finish's fenced write and checks, so either both commit or neither does. A worker
killed before COMMIT leaves the execution RUNNING with its checkpoints and no
continuation, and the next holder's finish continues it; once committed the execution
is SUCCEEDED and never finishes again. The unique index on `execution.continued_from`
(migration 0030) makes a second continuation of one finish impossible whatever happens.

The continued transition is accepted as if the person who started the run had asked for
it: the same actor and actor snapshot, the priority of the execution it continues, the
transition's concurrency key read from the data the finish wrote, and the checks of an
acceptance (the transition leaves the state; the key is there). A continuation that
fails them is not accepted: the request stays, released, in the state it reached, and
the finish's audit says why (`CONTINUATION_REFUSED`). After MAX_CONTINUATIONS
continuations in a row without a person the next one is accepted parked
RECONCILIATION_REQUIRED (`CONTINUATION_LIMIT`): an operator's retry lets it run (and
starts the count again), a fail releases the request where it is.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, insert, text

from orquestador.db.schema import audit_event
from orquestador.domain.concurrency import KeyMissing
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.statuses import ExecutionStatus
from orquestador.queue.acceptance import (
    CONCURRENCY_KEY_MISSING,
    TRANSITION_NOT_ALLOWED,
    queue_execution,
)
from orquestador.queue.fencing import WORKER_ACTOR, Claim, refuse_stale
from orquestador.queue.outcomes import Finish, finish_in_transaction, lease_still_valid

log = logging.getLogger(__name__)

# Why a continued execution waits for a person rather than running.
CONTINUATION_LIMIT = "CONTINUATION_LIMIT"
# The audit kinds a continuation writes on the execution it continues.
TRANSITION_CONTINUED = "TRANSITION_CONTINUED"
CONTINUATION_REFUSED = "CONTINUATION_REFUSED"

# Who started the run this execution belongs to, and what carries on with it. Read in
# the finish's transaction, after the finish locked the execution row.
_CHAIN = text(
    """
    SELECT e.org_id, e.flow_id, e.actor_snapshot, e.priority, e.continuations,
           e.simulation, e.rehearsal
    FROM execution e WHERE e.id = :execution_id
    """
)


@dataclass(frozen=True)
class Continuation:
    """What a finish into a continuing state accepts, and under which limits."""

    definition: FlowDefinition
    transition_id: str
    max_continuations: int
    max_attempts: int


@dataclass(frozen=True)
class Continued:
    """What became of a continuation: the execution accepted (parked at the limit, or
    not), or the code of why it was refused (no execution then)."""

    execution_id: uuid.UUID | None
    parked: bool = False
    refused: str | None = None


class _RequestNow(NamedTuple):
    """The request as the finish left it: what queue_execution reads of a request."""

    id: uuid.UUID
    org_id: str
    flow_id: uuid.UUID
    state: str
    revision: int
    data: Any


def finish_and_continue(
    conn: Connection,
    claim: Claim,
    finish: Finish,
    continuation: Continuation,
    before_commit: Callable[[], None] | None = None,
) -> Continued:
    """Commit the finish and accept its continuation in one transaction.

    Raises as finish_execution does (LeaseLost, RequestChanged, ContractMismatch); then
    nothing of the finish nor of the continuation is kept.
    """
    with conn.begin():
        finished = finish_in_transaction(conn, claim, finish)
        continued = _continue(conn, claim, finish, continuation, finished.revision)
        if before_commit is not None:
            before_commit()
            # As the finish's own seam: a lease that ran out meanwhile keeps nothing.
            if not lease_still_valid(conn, finished):
                raise refuse_stale(claim, "finish")
    return continued


def _continue(
    conn: Connection, claim: Claim, finish: Finish, continuation: Continuation, revision: int
) -> Continued:
    chain = conn.execute(_CHAIN, {"execution_id": claim.execution_id}).one()
    state, transition_id = finish.to_state, continuation.transition_id
    transition = continuation.definition.transitions.get(transition_id)
    if transition is None or not transition.leaves(state):
        # Publishing refuses such a flow; one stored before that rule is told here.
        return _refused(
            conn,
            claim,
            chain,
            state,
            transition_id,
            TRANSITION_NOT_ALLOWED,
            f"transition {transition_id!r} does not leave state {state!r}",
        )
    count = chain.continuations + 1
    parked = count > continuation.max_continuations
    actor_snapshot = chain.actor_snapshot or {}
    actor = actor_snapshot.get("sub") if isinstance(actor_snapshot, dict) else None
    try:
        execution_id = queue_execution(
            conn,
            request_row=_RequestNow(
                claim.request_id, chain.org_id, chain.flow_id, state, revision, finish.data
            ),
            definition=continuation.definition,
            transition_id=transition_id,
            actor=actor or WORKER_ACTOR,
            actor_snapshot=actor_snapshot,
            max_attempts=continuation.max_attempts,
            priority=chain.priority,
            simulation=chain.simulation,
            rehearsal=chain.rehearsal,
            started_by={"continuedFrom": str(claim.execution_id), "state": state},
            continued_from=claim.execution_id,
            continuations=count,
            parked_for=CONTINUATION_LIMIT if parked else None,
        )
    except KeyMissing as missing:
        # Raised before anything of the continuation is written.
        return _refused(
            conn,
            claim,
            chain,
            state,
            transition_id,
            CONCURRENCY_KEY_MISSING,
            f"the data gives no concurrency key at {missing.problem.path}",
        )
    _audit(
        conn,
        chain.org_id,
        claim.request_id,
        claim.execution_id,
        TRANSITION_CONTINUED,
        {
            "state": state,
            "transitionId": transition_id,
            "executionId": str(execution_id),
            "continuations": count,
            "parked": parked,
        },
    )
    if parked:
        _audit(
            conn,
            chain.org_id,
            claim.request_id,
            execution_id,
            ExecutionStatus.RECONCILIATION_REQUIRED,
            {
                "reason": CONTINUATION_LIMIT,
                "continuations": count,
                "limit": continuation.max_continuations,
                "continuedFrom": str(claim.execution_id),
            },
        )
        log.warning(
            "continuation parked: %d in a row without a person",
            count,
            extra={**claim.log_extra, "error_code": CONTINUATION_LIMIT},
        )
    return Continued(execution_id, parked=parked)


def _refused(
    conn: Connection,
    claim: Claim,
    chain: Any,
    state: str,
    transition_id: str,
    code: str,
    message: str,
) -> Continued:
    _audit(
        conn,
        chain.org_id,
        claim.request_id,
        claim.execution_id,
        CONTINUATION_REFUSED,
        {"state": state, "transitionId": transition_id, "code": code, "message": message},
    )
    log.warning("continuation refused: %s", code, extra={**claim.log_extra, "error_code": code})
    return Continued(None, refused=code)


def _audit(
    conn: Connection,
    org_id: str,
    request_id: uuid.UUID,
    execution_id: uuid.UUID,
    kind: str,
    detail: dict[str, Any],
) -> None:
    conn.execute(
        insert(audit_event).values(
            org_id=org_id,
            kind=kind,
            request_id=request_id,
            execution_id=execution_id,
            actor=WORKER_ACTOR,
            detail=detail,
        )
    )
