"""How an execution leaves RUNNING: retry, finish, fail, reconciliation or a step's error exit.

Each function is one fenced transaction. Those that touch the request lock it first,
then the execution, in that order everywhere, so two writers never deadlock. The
last statement is the fenced UPDATE of the execution itself: it re-checks owner,
token and lease by database time just before commit, and when it matches nothing
the whole transaction rolls back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text

from orquestador.db.schema import JSONB_VALUE
from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.errors import CancelRequested, ContractMismatch, RequestChanged
from orquestador.queue.checkpoints import CheckpointOutcome, write_attempt_outcome
from orquestador.queue.fencing import FENCE, WORKER_ACTOR, Claim, refuse_stale
from orquestador.queue.prepared import pipelined, run

log = logging.getLogger(__name__)


_LOCK_REQUEST = text(
    """
    SELECT r.state, r.revision, r.flow_id, r.busy_execution_id
    FROM request r WHERE r.id = :request_id
    FOR UPDATE
    """
)

# The accepted snapshot and the checkpoints, read with the execution row locked.
_LOCK_EXECUTION = text(
    f"""
    SELECT e.org_id, e.request_id, e.flow_id, e.transition_id, e.accepted_state,
           e.accepted_revision, e.lease_expires_at, e.cancel_requested_at,
           coalesce((SELECT array_agg(a.action_id) FROM action_execution a
                     WHERE a.execution_id = e.id
                       AND a.status = '{CheckpointStatus.SUCCEEDED}'), '{{}}') AS succeeded
    FROM execution e
    WHERE {FENCE}
    FOR UPDATE
    """
)

_STILL_VALID = text("SELECT CAST(:lease AS timestamptz) > clock_timestamp()")

# The write rule's facts, per writing action of the execution: its write is known to
# have happened (SUCCEEDED), or it may have happened and nobody knows (in doubt): the
# action has not succeeded and its latest attempt is RUNNING or UNKNOWN, or an earlier
# attempt in the history ended UNKNOWN (uncertain, or interrupted mid-call). A later
# attempt's FAILED does not undo an earlier attempt's write.
_WRITES = text(
    f"""
    SELECT
        coalesce(array_agg(a.action_id ORDER BY a.action_id)
                 FILTER (WHERE a.status = '{CheckpointStatus.SUCCEEDED}'), '{{}}') AS succeeded,
        coalesce(array_agg(a.action_id ORDER BY a.action_id)
                 FILTER (WHERE a.status <> '{CheckpointStatus.SUCCEEDED}' AND (
                     a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}')
                     OR EXISTS (SELECT 1 FROM action_attempt t
                                WHERE t.execution_id = a.execution_id
                                  AND t.action_id = a.action_id
                                  -- Attempts an operator settled (approving a retry
                                  -- because the effect did not happen) no longer count.
                                  AND t.attempt > a.attempt_base
                                  AND t.status = '{CheckpointStatus.UNKNOWN}'))),
                 '{{}}') AS in_doubt
    FROM action_execution a
    WHERE a.execution_id = :execution_id AND a.effect <> 'READ_ONLY'
      -- A dry run never calls a writer's invoke (its simulate, or nothing): no write
      -- happened, none can be in doubt.
      AND NOT EXISTS (SELECT 1 FROM execution x WHERE x.id = a.execution_id AND x.simulation)
    """
)

# What an operator needs to reconcile: every checkpoint and its attempts, without
# inputs or outputs.
_EVIDENCE = text(
    """
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'actionId', a.action_id, 'status', a.status, 'effect', a.effect,
               'attempt', a.attempt, 'externalKey', a.external_key,
               'capability', a.capability, 'adapterVersion', a.adapter_version,
               'errorCode', a.error_code,
               'attempts', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                'attempt', t.attempt, 'status', t.status,
                                'errorCode', t.error_code, 'message', t.message)
                                ORDER BY t.attempt), '[]'::jsonb)
                            FROM action_attempt t
                            WHERE t.execution_id = a.execution_id
                              AND t.action_id = a.action_id))
               ORDER BY a.started_at), '[]'::jsonb)
    FROM action_execution a WHERE a.execution_id = :execution_id
    """
)

_AUDIT = text(
    """
    INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
    SELECT e.org_id, :kind, e.request_id, e.id, :actor, :detail
    FROM execution e WHERE e.id = :execution_id
    """
).bindparams(bindparam("detail", type_=JSONB_VALUE))

_RELEASE_REQUEST = text(
    """
    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()
    WHERE id = :request_id AND busy_execution_id = :execution_id
    """
)

# An error exit moves the request and leaves its data exactly as it was.
_MOVE_REQUEST = text(
    """
    UPDATE request
    SET state = :state, revision = revision + 1,
        busy_execution_id = NULL, updated_at = clock_timestamp()
    WHERE id = :request_id AND busy_execution_id = :execution_id
    RETURNING revision
    """
)

_END_EXECUTION = text(
    f"""
    UPDATE execution AS e
    SET status = :status, result = :result, error_code = :error_code,
        error_detail = :error_detail, lease_owner = NULL, lease_expires_at = NULL,
        wait_key = NULL,
        finished_at = CASE WHEN :status IN ('{ExecutionStatus.SUCCEEDED}',
                                            '{ExecutionStatus.FAILED}')
                           THEN clock_timestamp() END,
        updated_at = clock_timestamp()
    WHERE {FENCE}
    RETURNING e.id
    """
).bindparams(bindparam("result", type_=JSONB_VALUE), bindparam("error_detail", type_=JSONB_VALUE))

# The three writes of a completed transition in one statement, so the fenced UPDATE
# of the execution (the lease check just before commit) is also the last round trip.
# Its predicate failing returns no row, and the caller rolls the request write back.
_COMPLETE = text(
    f"""
    WITH moved AS (
        -- The request takes the decided state and data and is free for its next transition.
        UPDATE request
        SET data = :data, state = :state, revision = revision + 1,
            busy_execution_id = NULL, updated_at = clock_timestamp()
        WHERE id = :request_id AND busy_execution_id = :execution_id
        RETURNING revision
    ), audited AS (
        -- The audit row explains the decision: transition, actions, hit policy, rules,
        -- and what each step saw when it was decided (observed: actionId -> facts), frozen here:
        -- audit rows are never rewritten, whatever the world does afterwards.
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT x.org_id, 'TRANSITION_COMPLETED', :request_id, :execution_id, :actor,
               :detail || jsonb_build_object('revision', moved.revision,
                                             'transitionId', x.transition_id,
                                             'fromState', x.accepted_state)
               || coalesce((SELECT jsonb_build_object(
                                       'observed', jsonb_object_agg(a.action_id, a.observed))
                            FROM action_execution a
                            WHERE a.execution_id = :execution_id AND a.observed IS NOT NULL
                            HAVING count(*) > 0), '{{}}'::jsonb)
        FROM moved, execution AS x
        WHERE x.id = :execution_id
    )
    UPDATE execution AS e
    SET status = '{ExecutionStatus.SUCCEEDED}', result = :result, error_code = NULL,
        error_detail = NULL,
        lease_owner = NULL, lease_expires_at = NULL, wait_key = NULL,
        finished_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE {FENCE}
    RETURNING e.id, (SELECT revision FROM moved) AS revision
    """
).bindparams(
    bindparam("data", type_=JSONB_VALUE),
    bindparam("detail", type_=JSONB_VALUE),
    bindparam("result", type_=JSONB_VALUE),
)

_OBSERVED = text(
    """
    SELECT observed FROM action_execution
    WHERE execution_id = :execution_id AND action_id = :action_id
    """
)

_WAIT_FOR_RETRY = text(
    f"""
    UPDATE execution AS e
    SET status = '{ExecutionStatus.RETRY_WAIT}',
        -- A cancel asked while the call ran: due at once, and the next holder applies it
        -- before calling anything (queue/cancel_requests.py).
        next_attempt_at = CASE WHEN e.cancel_requested_at IS NOT NULL THEN clock_timestamp()
                               ELSE clock_timestamp() + make_interval(secs => :delay_seconds)
                          END,
        lease_owner = NULL, lease_expires_at = NULL, error_code = :error_code,
        updated_at = clock_timestamp()
    WHERE {FENCE}
    RETURNING e.next_attempt_at
    """
)


@dataclass(frozen=True)
class Finish:
    """A decided transition, ready to commit."""

    to_state: str
    outcome: Any
    hit_policy: str | None
    rule_ids: list[str]
    action_ids: list[str]
    data: Any


def _audit(conn: Connection, claim: Claim, kind: str, detail: dict[str, Any]) -> None:
    conn.execute(
        _AUDIT,
        {"execution_id": claim.execution_id, "kind": kind, "actor": WORKER_ACTOR, "detail": detail},
    )


def _end(
    conn: Connection,
    claim: Claim,
    status: str,
    error_code: str | None,
    result: dict[str, Any] | None,
    what: str,
    error_detail: dict[str, Any] | None = None,
) -> None:
    row = conn.execute(
        _END_EXECUTION,
        {
            **claim.params,
            "status": status,
            "error_code": error_code,
            "result": result,
            "error_detail": error_detail or None,
        },
    ).first()
    if row is None:
        raise refuse_stale(claim, what)


@dataclass(frozen=True)
class Writes:
    """The write rule's facts about one execution (see _WRITES)."""

    succeeded: list[str]
    in_doubt: list[str]


def writes_of(conn: Connection, execution_id: uuid.UUID) -> Writes:
    """The write rule's facts about one execution, read in the caller's transaction."""
    row = conn.execute(_WRITES, {"execution_id": execution_id}).one()
    return Writes(list(row.succeeded), list(row.in_doubt))


def _writes(conn: Connection, claim: Claim) -> Writes:
    return writes_of(conn, claim.execution_id)


def _lock_request_then_execution(conn: Connection, claim: Claim, what: str) -> tuple[Any, Any]:
    request = run(conn, _LOCK_REQUEST, {"request_id": claim.request_id}).fetchone()
    execution = run(conn, _LOCK_EXECUTION, claim.params).fetchone()
    if execution is None or request is None:
        raise refuse_stale(claim, what)
    return request, execution


def request_change(request: Any, execution: Any, claim: Claim) -> str | None:
    """Why the request no longer matches what the execution accepted, or None."""
    if request.busy_execution_id != claim.execution_id:
        return "the request is no longer held by this execution"
    if request.flow_id != execution.flow_id:
        return "the request is pinned to another flow version"
    if request.state != execution.accepted_state or request.revision != execution.accepted_revision:
        return (
            f"request is {request.state!r} at revision {request.revision}, accepted in "
            f"{execution.accepted_state!r} at {execution.accepted_revision}"
        )
    return None


def _evidence(conn: Connection, claim: Claim) -> list[dict[str, Any]]:
    return conn.execute(_EVIDENCE, {"execution_id": claim.execution_id}).scalar_one()


def _park(conn: Connection, claim: Claim, reason: str, detail: dict[str, Any], what: str) -> str:
    _audit(
        conn,
        claim,
        ExecutionStatus.RECONCILIATION_REQUIRED,
        {"reason": reason, **detail, "checkpoints": _evidence(conn, claim)},
    )
    _end(conn, claim, ExecutionStatus.RECONCILIATION_REQUIRED, reason, None, what, detail)
    log.warning(
        "execution needs reconciliation: %s",
        reason,
        extra={**claim.log_extra, "error_code": reason, **_log_detail(detail)},
    )
    return ExecutionStatus.RECONCILIATION_REQUIRED


def _log_detail(detail: dict[str, Any]) -> dict[str, Any]:
    # The stable ids an operator greps for; the detail holds no values, only names.
    return {"action_id": detail["actionId"]} if "actionId" in detail else {}


def schedule_retry(
    conn: Connection,
    claim: Claim,
    outcome: CheckpointOutcome,
    delay_seconds: float,
    attempt: int,
) -> None:
    """Attempt checkpoint, RETRY_WAIT with its due time, and RETRY_SCHEDULED audit: together."""
    with conn.begin():
        # Ending the attempt locks the execution under the fence first (LeaseLost if
        # stale); the audit row and the fenced move to RETRY_WAIT follow under that lock.
        write_attempt_outcome(conn, claim, outcome)
        _audit(
            conn,
            claim,
            "RETRY_SCHEDULED",
            {
                "actionId": outcome.action_id,
                "attempt": attempt,
                "errorCode": outcome.error_code,
                "delaySeconds": round(delay_seconds, 3),
            },
        )
        row = conn.execute(
            _WAIT_FOR_RETRY,
            {
                **claim.params,
                "delay_seconds": float(delay_seconds),
                "error_code": outcome.error_code,
            },
        ).first()
        if row is None:
            raise refuse_stale(claim, "schedule retry")


def finish_documents(finish: Finish) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TRANSITION_COMPLETED detail (before what SQL adds) and the execution result."""
    # The transition id and the state it left come from the execution row, in SQL.
    detail = {
        "actionIds": finish.action_ids,
        "hitPolicy": finish.hit_policy,
        "ruleIds": finish.rule_ids,
        "toState": finish.to_state,
        "outcome": finish.outcome,
    }
    result = {
        "outcome": finish.outcome,
        "toState": finish.to_state,
        "ruleIds": finish.rule_ids,
        "hitPolicy": finish.hit_policy,
    }
    return detail, result


def finish_execution(
    conn: Connection,
    claim: Claim,
    finish: Finish,
    before_commit: Callable[[], None] | None = None,
) -> None:
    """Commit the transition: request data/state/revision, result, TRANSITION_COMPLETED audit.

    Raises LeaseLost, RequestChanged (state, revision, holder or flow moved since
    acceptance) or ContractMismatch (an expected checkpoint is not SUCCEEDED); in
    every case nothing of the finish is kept and the checkpoints stay as they were.
    """
    with conn.begin():
        finished = finish_in_transaction(conn, claim, finish)
        if before_commit is not None:
            before_commit()
            # The hook took time: the lease, as locked (the write above ended it), must
            # still hold by the clock, or nothing of the finish is kept.
            if not lease_still_valid(conn, finished):
                raise refuse_stale(claim, "finish")


@dataclass(frozen=True)
class Finished:
    """What a finish wrote and held: the request's new revision, the lease as locked."""

    revision: int
    lease_expires_at: Any


def lease_still_valid(conn: Connection, finished: Finished) -> bool:
    """Whether the lease the finish locked is still valid by the database's clock."""
    return bool(conn.execute(_STILL_VALID, {"lease": finished.lease_expires_at}).scalar())


def finish_in_transaction(conn: Connection, claim: Claim, finish: Finish) -> Finished:
    """finish_execution's writes and checks inside the caller's open transaction (a
    continuation is accepted in the same one). Raises as finish_execution does; the
    caller's transaction then rolls back whole."""
    detail, result = finish_documents(finish)
    # Both locks (request first, then execution) and the write go in one round trip;
    # the server runs them in that order. The checks below read what the locks
    # returned, and any refusal rolls the write back with the rest.
    with pipelined(conn):
        locked_request = run(conn, _LOCK_REQUEST, {"request_id": claim.request_id})
        locked_execution = run(conn, _LOCK_EXECUTION, claim.params)
        completed = run(
            conn,
            _COMPLETE,
            {
                **claim.params,
                "request_id": claim.request_id,
                "actor": WORKER_ACTOR,
                "data": finish.data,
                "state": finish.to_state,
                "detail": detail,
                "result": result,
            },
        )
    request, execution = locked_request.fetchone(), locked_execution.fetchone()
    row = completed.fetchone()
    if execution is None or request is None:
        raise refuse_stale(claim, "finish")
    if execution.cancel_requested_at is not None:
        # A person asked to cancel while the last call ran: the holder applies it instead.
        raise CancelRequested(f"execution {claim.execution_id}: a cancel was requested")
    change = request_change(request, execution, claim)
    if change:
        raise RequestChanged(change)
    missing = [a for a in finish.action_ids if a not in set(execution.succeeded)]
    if missing:
        raise ContractMismatch(f"checkpoints not SUCCEEDED at finish: {missing}")
    if row is None:
        raise refuse_stale(claim, "finish")
    if row.revision is None:  # cannot happen under the request lock; never write half
        raise RequestChanged("the request is no longer held by this execution")
    return Finished(row.revision, execution.lease_expires_at)


def fail_execution(
    conn: Connection,
    claim: Claim,
    error_code: str,
    *,
    attempt_outcome: CheckpointOutcome | None = None,
    detail: dict[str, Any] | None = None,
) -> str:
    """End the execution after a failure; return the status it ended in.

    FAILED, with the request released, only when no write happened or may have
    happened in this execution (the write rule, read from the checkpoints and the
    attempt history inside this transaction); otherwise RECONCILIATION_REQUIRED with
    the request still busy.
    """
    detail = detail or {}
    with conn.begin():
        _lock_request_then_execution(conn, claim, "fail")
        if attempt_outcome is not None:
            write_attempt_outcome(conn, claim, attempt_outcome)
        writes = _writes(conn, claim)
        if writes.succeeded or writes.in_doubt:
            return _park(
                conn,
                claim,
                error_code,
                {
                    "failure": error_code,
                    **detail,
                    "writesSucceeded": writes.succeeded,
                    "writesInDoubt": writes.in_doubt,
                },
                "fail",
            )
        conn.execute(
            _RELEASE_REQUEST,
            {"request_id": claim.request_id, "execution_id": claim.execution_id},
        )
        _audit(conn, claim, "EXECUTION_FAILED", {"errorCode": error_code, **detail})
        _end(conn, claim, ExecutionStatus.FAILED, error_code, None, "fail", detail)
    log.info(
        "execution failed: %s",
        error_code,
        extra={**claim.log_extra, "error_code": error_code, **_log_detail(detail)},
    )
    return ExecutionStatus.FAILED


def require_reconciliation(
    conn: Connection,
    claim: Claim,
    reason: str,
    *,
    attempt_outcome: CheckpointOutcome | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Park the execution in RECONCILIATION_REQUIRED; the request stays busy for an operator."""
    with conn.begin():
        _lock_request_then_execution(conn, claim, "require reconciliation")
        if attempt_outcome is not None:
            write_attempt_outcome(conn, claim, attempt_outcome)
        _park(conn, claim, reason, detail or {}, "require reconciliation")


def exit_on_error(
    conn: Connection,
    claim: Claim,
    attempt_outcome: CheckpointOutcome,
    on_error_state: str,
    action_ids: Sequence[str],
) -> str:
    """Take a step's declared error exit: the request moves to `on_error_state`, audited.

    A PermanentError says this attempt's own effect did not happen, and earlier
    successes are known facts the audit row lists, so the declared exit is safe with
    them. A write in doubt anywhere in the execution, this action's earlier attempts
    included, makes the outcome unknowable: then the execution goes to reconciliation
    instead and the request stays where it was. The request's data is never touched.
    Returns the status the execution ended in.
    """
    action_id = attempt_outcome.action_id
    with conn.begin():
        request, execution = _lock_request_then_execution(conn, claim, "error exit")
        change = request_change(request, execution, claim)
        if change:
            raise RequestChanged(change)
        write_attempt_outcome(conn, claim, attempt_outcome)
        writes = _writes(conn, claim)
        if writes.in_doubt:
            return _park(
                conn,
                claim,
                attempt_outcome.error_code,
                {
                    "actionId": action_id,
                    "onError": on_error_state,
                    "writesSucceeded": writes.succeeded,
                    "writesInDoubt": writes.in_doubt,
                },
                "error exit",
            )
        observed = conn.execute(
            _OBSERVED, {"execution_id": claim.execution_id, "action_id": action_id}
        ).scalar()
        revision = conn.execute(
            _MOVE_REQUEST,
            {
                "request_id": claim.request_id,
                "execution_id": claim.execution_id,
                "state": on_error_state,
            },
        ).scalar_one()
        _audit(
            conn,
            claim,
            "STEP_ERROR_EXIT",
            {
                "transitionId": execution.transition_id,
                "actionId": action_id,
                "errorCode": attempt_outcome.error_code,
                "fromState": execution.accepted_state,
                "toState": on_error_state,
                "revision": revision,
                "message": attempt_outcome.message,
                # What the failing step saw (the latest of its observations, as stored
                # with the attempt's outcome just above), frozen with the decision.
                "observed": {action_id: observed} if observed is not None else {},
                "actionIds": list(action_ids),
                "checkpoints": _evidence(conn, claim),
            },
        )
        _end(
            conn,
            claim,
            ExecutionStatus.FAILED,
            attempt_outcome.error_code,
            {"outcome": "STEP_ERROR", "toState": on_error_state, "actionId": action_id},
            "error exit",
            {"actionId": action_id, "onError": on_error_state},
        )
    log.info(
        "step error exit to %s: %s",
        on_error_state,
        attempt_outcome.error_code,
        extra={**claim.log_extra, "action_id": action_id, "error_code": attempt_outcome.error_code},
    )
    return ExecutionStatus.FAILED
