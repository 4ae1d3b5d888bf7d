"""What only a person may do to an execution: resolve a parked one, or cancel one not started.

Each function is one transaction that locks the request, then the execution (the
order every writer uses), re-reads the execution's status under the lock and
refuses when it is not what the decision needs: two operators deciding at once
queue on the lock, and the second finds the first's outcome and gets
NotReconcilable (or NotCancellable). A claim takes rows with SKIP LOCKED, so it
never takes an execution while a cancel holds it, and a cancel that waited for a
claim finds it RUNNING and refuses.

A retry may carry a correction of the request data (a JSON Pointer patch, checked
against the flow's data schema): it is written in the same transaction as the retry, at
a new revision of the request that the execution accepts as its own, so the retried
step reads the corrected data; the audit row keeps each path's value before and after.
A correction that would change the input of a step that already succeeded is refused:
that step is not run again, and its checkpoint would no longer describe what it read.

A cancel obeys the write rule like a failure does: after a write that happened or
may have happened it parks the execution for an operator instead of releasing the
request, which a resubmission could otherwise use to write again. A RUNNING execution
is not cut mid-call: the cancel is recorded as requested (who, why, when) and its
holder applies it, by the same rule, once the step's call has returned
(queue/cancel_requests.py). A write whose only
effect is a machine command no agent took, withdrawn in the cancel's own transaction,
counts as not done (SPEC 23): there is nothing for a person to decide.

`cancel_in_transaction` and `resolve_in_transaction` are the same work inside a
transaction the caller owns: a bulk action's item records its outcome in it
(queue/bulk.py), so the action and its record commit together or not at all.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, text

from orquestador import metrics
from orquestador.db.schema import EXECUTION_READY_CHANNEL, JSONB_VALUE
from orquestador.domain.canonical import input_hash
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.errors import DataSchemaError, DataValidationError, MappingError
from orquestador.domain.flow_definition import ActionSpec, FlowDefinition
from orquestador.domain.mappings import build_context, format_placeholders, resolve_inputs
from orquestador.domain.pointer_updates import correct_request_data
from orquestador.domain.statuses import UNHELD, CheckpointStatus, ExecutionStatus, in_order
from orquestador.errors import DecisionInvalid, NotCancellable, NotReconcilable, Problem, StaleItem
from orquestador.machines.cancel import (
    CancelledCommands,
    cancel_for_execution,
    untaken_command_steps,
)
from orquestador.queue.outcomes import Writes, writes_of
from orquestador.redaction import redact_json

log = logging.getLogger(__name__)

# The error code of a checkpoint an operator discarded so that its step runs again.
RETRY_APPROVED = "RETRY_APPROVED"
DECISIONS = ("confirm", "retry", "fail")
# A cancel ends an execution no worker holds (UNHELD); one of a RUNNING execution is
# recorded and applied by its holder.
CANCEL_REQUESTABLE = ExecutionStatus.RUNNING
# The audit kind of that record, and what it means in words.
CANCEL_REQUESTED = "CANCEL_REQUESTED"
CANCEL_REQUESTED_WORDS = (
    "cancel requested: the step's call is running; the execution stops when the call returns"
)
# Why a cancel parked its execution instead of ending it: writes done or in doubt.
CANCELLED_AFTER_WRITES = "CANCELLED_AFTER_WRITES"
# A retry's correction the data schema, the size limit or the pointers refuse.
CORRECTION_INVALID = "CORRECTION_INVALID"

_LOCK = text(
    """
    WITH target AS (
        SELECT e.request_id FROM execution e WHERE e.id = :execution_id AND e.org_id = :org_id
    ), locked_request AS (
        SELECT r.id, r.state, r.revision, r.busy_execution_id
        FROM request r, target WHERE r.id = target.request_id
        FOR UPDATE OF r
    )
    SELECT locked_request.state AS request_state, locked_request.busy_execution_id
    FROM locked_request
    """
)

_LOCK_EXECUTION = text(
    """
    SELECT e.id, e.org_id, e.request_id, e.flow_id, e.transition_id, e.status, e.error_code,
           e.error_detail, e.accepted_state, e.accepted_revision, e.attempts, e.updated_at,
           e.concurrency_key, e.cancel_requested_at, f.definition
    FROM execution e JOIN flow f ON f.id = e.flow_id
    WHERE e.id = :execution_id AND e.org_id = :org_id
    FOR UPDATE OF e
    """
)

_CHECKPOINTS = text(
    """
    SELECT action_id, status, attempt, attempt_base, fencing_token, input_hash, external_key,
           effect, capability, adapter_version, output, error_code, started_at, finished_at
    FROM action_execution WHERE execution_id = :execution_id
    ORDER BY started_at, action_id
    """
)

_CONFIRM_STEP = text(
    f"""
    UPDATE action_execution
    SET status = '{CheckpointStatus.SUCCEEDED}', output = :output, error_code = NULL,
        finished_at = clock_timestamp()
    WHERE execution_id = :execution_id AND action_id = :action_id
    """
).bindparams(bindparam("output", type_=JSONB_VALUE))

# A RUNNING attempt nobody saw end enters the history first, as the worker records one.
_INTERRUPTED_INTO_HISTORY = text(
    f"""
    INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                error_code, message, started_at, finished_at)
    SELECT execution_id, action_id, attempt, fencing_token,
           CASE WHEN effect = 'READ_ONLY' THEN '{CheckpointStatus.FAILED}'
                ELSE '{CheckpointStatus.UNKNOWN}' END,
           'INTERRUPTED', NULL, started_at, NULL
    FROM action_execution
    WHERE execution_id = :execution_id AND action_id = :action_id
      AND status = '{CheckpointStatus.RUNNING}'
    ON CONFLICT DO NOTHING
    """
)

# The step runs again as new: a fresh attempt budget (attempt_base), and a fresh first
# start, which the next start records, so a wait's deadline counts from the retry and
# an expired wait the operator retried does not fail again at once.
_APPROVE_RETRY = text(
    f"""
    UPDATE action_execution
    SET status = '{CheckpointStatus.FAILED}', error_code = :code, attempt_base = attempt,
        first_started_at = NULL, finished_at = coalesce(finished_at, clock_timestamp())
    WHERE execution_id = :execution_id AND action_id = :action_id
    """
)

# Back in the queue, due now, with a fresh budget of claims; it continues from its
# checkpoints like any execution a worker recovers. A continuation parked at
# MAX_CONTINUATIONS that a person lets run starts the count of continuations again:
# a person has just asked for it.
_REQUEUE = text(
    f"""
    UPDATE execution
    SET continuations = CASE WHEN error_code = 'CONTINUATION_LIMIT' THEN 0
                             ELSE continuations END,
        status = '{ExecutionStatus.PENDING}', next_attempt_at = clock_timestamp(),
        error_code = NULL,
        error_detail = NULL, result = NULL, lease_owner = NULL, lease_expires_at = NULL,
        max_attempts = attempts + :claims_budget, cancel_requested_at = NULL,
        cancel_requested_by = NULL, cancel_requested_reason = NULL,
        updated_at = clock_timestamp()
    WHERE id = :execution_id
    """
)

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")

# A cancel asked of a RUNNING execution, kept as first asked: a second request while
# the first waits for the call changes nothing. Under the execution's lock, so the
# batch writer's next RUNNING or finish of it sees the request (or this waits for it).
_REQUEST_CANCEL = text(
    f"""
    UPDATE execution
    SET cancel_requested_at = clock_timestamp(), cancel_requested_by = :actor,
        cancel_requested_reason = :reason, updated_at = clock_timestamp()
    WHERE id = :execution_id AND status = '{ExecutionStatus.RUNNING}'
      AND cancel_requested_at IS NULL
    RETURNING cancel_requested_at
    """
)

# The request row is locked already (_LOCK); its data is read only for a correction.
_DATA_TO_CORRECT = text(
    """
    SELECT r.data, f.data_schema
    FROM request r JOIN flow f ON f.id = :flow_id
    WHERE r.id = :request_id
    """
)

# A correction is a change of the request: a new revision, which the execution accepts
# as its own in the same statement, so the load's and the finish's check (the request is
# as accepted) passes and the retried step reads the corrected data. Only while this
# execution holds the request as it accepted it: a change made by anything else is not
# turned into an accepted one.
_CORRECT = text(
    """
    WITH corrected AS (
        UPDATE request
        SET data = :data, revision = revision + 1, updated_at = clock_timestamp()
        WHERE id = :request_id AND busy_execution_id = :execution_id
          AND state = :accepted_state AND revision = :accepted_revision
        RETURNING revision
    )
    UPDATE execution AS e
    SET accepted_revision = corrected.revision, updated_at = clock_timestamp()
    FROM corrected
    WHERE e.id = :execution_id
    RETURNING e.accepted_revision
    """
).bindparams(bindparam("data", type_=JSONB_VALUE))

_END = text(
    """
    UPDATE execution
    SET status = :status, result = :result, error_code = :error_code,
        lease_owner = NULL, lease_expires_at = NULL, wait_key = NULL,
        finished_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :execution_id
    """
).bindparams(bindparam("result", type_=JSONB_VALUE))

_MOVE_REQUEST = text(
    """
    UPDATE request
    SET state = :state, revision = revision + 1, busy_execution_id = NULL,
        updated_at = clock_timestamp()
    WHERE id = :request_id AND busy_execution_id = :execution_id
    RETURNING revision
    """
)

_RELEASE_REQUEST = text(
    """
    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()
    WHERE id = :request_id AND busy_execution_id = :execution_id
    RETURNING revision
    """
)

# Parked as the worker parks: not due, not finished, the request still held by it.
_PARK = text(
    f"""
    UPDATE execution
    SET status = '{ExecutionStatus.RECONCILIATION_REQUIRED}', error_code = :error_code,
        error_detail = :error_detail, lease_owner = NULL, lease_expires_at = NULL,
        wait_key = NULL, updated_at = clock_timestamp()
    WHERE id = :execution_id
    """
).bindparams(bindparam("error_detail", type_=JSONB_VALUE))

_AUDIT = text(
    """
    INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
    VALUES (:org_id, :kind, :request_id, :execution_id, :actor, :detail)
    """
).bindparams(bindparam("detail", type_=JSONB_VALUE))


@dataclass(frozen=True)
class Resolution:
    """An operator's decision on a parked execution."""

    execution_id: uuid.UUID
    org_id: str
    actor: str
    decision: str  # confirm | retry | fail
    reason: str
    action_id: str | None = None  # the step in doubt; None when no step is in doubt
    output: dict[str, Any] | None = None  # confirm: what the step returned
    to_state: str | None = None  # fail: where the request goes
    # A bulk decision by query names no step: it applies to whichever step is in doubt
    # when the execution is locked, and the audit row names that step and the bulk.
    bulk_id: uuid.UUID | None = None
    # retry only: (JSON Pointer into the request data, new value) pairs, as a flow's
    # `updates` address the data ("/amount"), applied in order with the retry.
    correction: tuple[tuple[str, Any], ...] | None = None
    # A bulk item's decision: the execution's updated_at when the bulk was accepted. An
    # execution changed since is another episode, which nobody in the bulk saw.
    seen_updated_at: datetime | None = None


# (capability, version, output) -> the JSON Pointers where output breaks the adapter's
# output schema; raises IntegrationUnavailable when no such adapter is configured.
OutputProblems = Callable[[str, int, Any], list[str]]


def step_in_doubt(
    checkpoints: Sequence[Any], parked_for: str | None = None, detail: dict[str, Any] | None = None
) -> Any | None:
    """The checkpoint an operator decides about, if any.

    A contract mismatch names its step (`detail.actionId`): a checkpoint recorded for
    something else, whatever its status. Otherwise it is the one checkpoint that is not
    SUCCEEDED: a transition's actions run one after another and each starts only once
    the one before it succeeded, so at most one can be unfinished. None when every step
    succeeded (the execution parked after its writes, at the decision or the finish).
    """
    if parked_for == "CONTRACT_MISMATCH" and detail and detail.get("actionId"):
        named = [c for c in checkpoints if c.action_id == detail["actionId"]]
        if named:
            return named[0]
    unfinished = [c for c in checkpoints if c.status != CheckpointStatus.SUCCEEDED]
    return unfinished[-1] if unfinished else None


def _checkpoint_as_it_was(step: Any) -> dict[str, Any] | None:
    if step is None:
        return None
    return {
        "actionId": step.action_id,
        "status": step.status,
        "attempt": step.attempt,
        "errorCode": step.error_code,
        "externalKey": step.external_key,
        "inputHash": step.input_hash,
        "effect": step.effect,
        "capability": step.capability,
        "adapterVersion": step.adapter_version,
    }


def _lock(conn: Connection, execution_id: uuid.UUID, org_id: str) -> tuple[Any, Any]:
    params = {"execution_id": execution_id, "org_id": org_id}
    request = conn.execute(_LOCK, params).first()
    execution = conn.execute(_LOCK_EXECUTION, params).first()
    if request is None or execution is None:
        raise NotReconcilable("no such execution")
    return request, execution


def _audit(conn: Connection, execution: Any, kind: str, actor: str, detail: dict[str, Any]) -> None:
    conn.execute(
        _AUDIT,
        {
            "org_id": execution.org_id,
            "kind": kind,
            "request_id": execution.request_id,
            "execution_id": execution.id,
            "actor": actor,
            "detail": detail,
        },
    )


def resolve(
    conn: Connection,
    resolution: Resolution,
    *,
    output_problems: OutputProblems,
    claims_budget: int,
) -> str:
    """Apply the decision in one transaction; return the execution's new status.

    Raises NotReconcilable (not parked, or not this step, or a decision the step does
    not accept) and DecisionInvalid (output or destination state refused).
    """
    with conn.begin():
        status = resolve_in_transaction(
            conn, resolution, output_problems=output_problems, claims_budget=claims_budget
        )
    if status == ExecutionStatus.FAILED:
        metrics.count_move(status)
    return status


def resolve_in_transaction(
    conn: Connection,
    resolution: Resolution,
    *,
    output_problems: OutputProblems,
    claims_budget: int,
) -> str:
    """resolve() inside the caller's transaction, which commits it (a bulk item's outcome
    is recorded in the same one); counts nothing in the metrics."""
    if resolution.decision not in DECISIONS:
        raise DecisionInvalid("DECISION_UNKNOWN", f"decision is one of {', '.join(DECISIONS)}")
    if resolution.correction is not None and resolution.decision != "retry":
        raise DecisionInvalid(
            CORRECTION_INVALID, "only a retry decision takes a correction", ["/correction"]
        )
    request, execution = _lock(conn, resolution.execution_id, resolution.org_id)
    seen = resolution.seen_updated_at
    if seen is not None and execution.updated_at != seen:
        # Read under the lock: a decision racing this one has committed or waits behind.
        raise StaleItem(
            f"the execution changed after the bulk was accepted (it is now {execution.status});"
            " the bulk decides only about what it matched: open the execution and decide"
            " about it on its own"
        )
    if execution.status != ExecutionStatus.RECONCILIATION_REQUIRED:
        raise NotReconcilable(f"the execution is {execution.status}, not parked for a decision")
    checkpoints = conn.execute(_CHECKPOINTS, {"execution_id": execution.id}).all()
    step = step_in_doubt(checkpoints, execution.error_code, execution.error_detail)
    expected = step.action_id if step is not None else None
    if resolution.bulk_id is not None:
        resolution = replace(resolution, action_id=expected)
    if resolution.action_id != expected:
        raise NotReconcilable(
            f"the step in doubt is {expected!r}, not {resolution.action_id!r}"
            if expected
            else "no step is in doubt: decide without an actionId (retry or fail)"
        )
    if resolution.decision == "confirm" and (
        step is None or execution.error_code == "CONTRACT_MISMATCH"
    ):
        raise NotReconcilable(
            "confirm needs a step in doubt whose checkpoint describes the current contract;"
            " retry or fail instead"
        )
    corrected = (
        {}
        if resolution.correction is None
        else _correct(conn, execution, resolution.correction, checkpoints, step)
    )
    deciding = _Deciding(conn, resolution, execution, request, step, output_problems, claims_budget)
    status = {"confirm": deciding.confirm, "retry": deciding.retry, "fail": deciding.fail}[
        resolution.decision
    ]()
    _audit(
        conn,
        execution,
        "RECONCILIATION_RESOLVED",
        resolution.actor,
        {
            "decision": resolution.decision,
            "actionId": resolution.action_id,
            "reason": resolution.reason,
            "parkedFor": execution.error_code,
            "checkpoint": _checkpoint_as_it_was(step),
            "status": status,
            # A confirm's output is the decision itself: the timeline shows it with the
            # reason. Any configured secret the operator pasted into it is not kept.
            **(
                {"output": redact_json(resolution.output)}
                if resolution.decision == "confirm"
                else {}
            ),
            **corrected,
            **_bulk_detail(resolution.bulk_id),
        },
    )
    return status


def _correct(
    conn: Connection,
    execution: Any,
    correction: tuple[tuple[str, Any], ...],
    checkpoints: Sequence[Any],
    in_doubt: Any,
) -> dict[str, Any]:
    """Write a retry's correction; what the audit row keeps of it.

    `{"correction": [{path, before, after}], "correctedRevision": N}`: each path with
    the value the step saw (left out when the path did not exist) and the value now, and
    the request's revision that holds the corrected data. Raises DecisionInvalid with the
    problems at `/correction/N/path` or `/correction/N/value`, before anything is written.
    """
    params = {"request_id": execution.request_id, "execution_id": execution.id}
    current = conn.execute(_DATA_TO_CORRECT, {**params, "flow_id": execution.flow_id}).one()
    try:
        data, changes = correct_request_data(current.data, current.data_schema, correction)
    except DataSchemaError as exc:
        raise DecisionInvalid(
            exc.code,
            "the flow's data schema cannot be used; publish a version that fixes it",
            problems=exc.problems,
        ) from None
    except DataValidationError as exc:
        raise DecisionInvalid(
            CORRECTION_INVALID,
            "the correction cannot be applied to the request data",
            problems=[Problem(f"/correction{p.path}", p.message) for p in exc.problems],
        ) from None
    _keep_the_key(execution, data, correction)
    _keep_what_finished_steps_read(execution, data, correction, checkpoints, in_doubt)
    revision = conn.execute(
        _CORRECT,
        {
            **params,
            "data": data,
            "accepted_state": execution.accepted_state,
            "accepted_revision": execution.accepted_revision,
        },
    ).scalar()
    if revision is None:
        raise NotReconcilable(
            "the request is no longer as its transition accepted it, so it cannot be"
            " corrected: retry without a correction, or fail"
        )
    return {"correction": [c.as_json() for c in changes], "correctedRevision": revision}


def _keep_the_key(execution: Any, data: Any, correction: tuple[tuple[str, Any], ...]) -> None:
    """Refuse a correction that changes the value the execution's concurrency key read.

    The execution holds its key from its first claim, computed at acceptance: corrected
    data naming another machine would run on it while another execution holds that key.
    """
    if execution.concurrency_key is None:
        return
    flow = FlowDefinition.from_json(execution.definition)
    transition = flow.transitions.get(execution.transition_id)
    concurrency = transition.concurrency if transition is not None else None
    if concurrency is None:
        return
    try:
        corrected: str | None = key_value(concurrency, data)
    except KeyMissing:
        corrected = None
    if corrected == execution.concurrency_key:
        return
    key_path = concurrency.pointer.removeprefix("/data")
    where = next(
        (
            f"/correction/{index}/path"
            for index, (path, _) in enumerate(correction)
            if key_path == path or key_path.startswith(path + "/") or path.startswith(key_path)
        ),
        "/correction",
    )
    now = "no value" if corrected is None else repr(corrected)
    raise DecisionInvalid(
        CORRECTION_INVALID,
        f"the correction changes the transition's concurrency key {concurrency.pointer}"
        f" ({execution.concurrency_key!r} to {now}); the execution holds the key it was"
        " accepted with: cancel or fail it and start the transition again for the other value",
        problems=[
            Problem(
                where,
                f"changes the concurrency key {concurrency.pointer}, which the execution holds",
            )
        ],
    )


def _data_read(spec: ActionSpec) -> list[str]:
    """The request data paths a step's input mapping reads ("/note" for "/data/note")."""
    pointers: list[str] = []
    for source in spec.input.values():
        if "from" in source:
            pointers.append(source["from"])
        elif isinstance(source.get("format"), str):
            pointers.extend(format_placeholders(source["format"]))
    return [p.removeprefix("/data") for p in pointers if p == "/data" or p.startswith("/data/")]


def _overlaps(read: str, path: str) -> bool:
    return read == path or read.startswith(path + "/") or path.startswith(read + "/")


def _keep_what_finished_steps_read(
    execution: Any,
    data: Any,
    correction: tuple[tuple[str, Any], ...],
    checkpoints: Sequence[Any],
    in_doubt: Any,
) -> None:
    """Refuse a correction that changes the input of a step that already succeeded.

    The worker goes on past such a step with its recorded output, after recomputing its
    input as it does for any step (its mapping over the data, the outputs before it, the
    request): an input hash other than the checkpoint's parks the execution
    CONTRACT_MISMATCH. So the input is recomputed here the same way, with the corrected
    data; a step whose input cannot be recomputed (it reads an output not recorded) is
    refused too, since the worker could not reuse it either.
    """
    flow = FlowDefinition.from_json(execution.definition)
    transition = flow.transitions.get(execution.transition_id)
    if transition is None:
        return
    recorded = {c.action_id: c for c in checkpoints}
    retried = in_doubt.action_id if in_doubt is not None else None
    outputs: dict[str, Any] = {}
    problems: list[Problem] = []
    for spec in transition.actions:
        checkpoint = recorded.get(spec.id)
        if (
            checkpoint is None
            or checkpoint.status != CheckpointStatus.SUCCEEDED
            or spec.id == retried
        ):
            continue
        context = build_context(data, outputs, execution.request_id, execution.accepted_state)
        outputs[spec.id] = checkpoint.output
        try:
            same = input_hash(resolve_inputs(spec.input, context)) == checkpoint.input_hash
        except (MappingError, ValueError, TypeError):
            same = False
        if same:
            continue
        read = _data_read(spec)
        places = [
            f"/correction/{index}/path"
            for index, (path, _) in enumerate(correction)
            if any(_overlaps(r, path) for r in read)
        ]
        problems.extend(
            Problem(
                place,
                f"step {spec.id!r} already succeeded with the value here; a correction cannot"
                " change what a finished step read (fail the execution and start again)",
            )
            for place in places
        )
        if not places:
            problems.append(
                Problem(
                    "/correction",
                    f"step {spec.id!r} already succeeded and its input cannot be recomputed"
                    " with the corrected data, so the correction may change what it read"
                    " (retry without a correction, or fail the execution and start again)",
                )
            )
    if problems:
        raise DecisionInvalid(
            CORRECTION_INVALID,
            "the correction changes the input of a step that already succeeded, which is not"
            " run again: retry without it, or fail the execution and start the transition again",
            problems=problems,
        )


def _bulk_detail(bulk_id: uuid.UUID | None) -> dict[str, str]:
    return {} if bulk_id is None else {"bulkId": str(bulk_id)}


@dataclass(frozen=True)
class _Deciding:
    """One decision under way, inside resolve()'s transaction, with the rows it locked."""

    conn: Connection
    resolution: Resolution
    execution: Any
    request: Any
    step: Any
    output_problems: OutputProblems
    claims_budget: int

    def _requeue(self) -> str:
        self.conn.execute(
            _REQUEUE, {"execution_id": self.execution.id, "claims_budget": self.claims_budget}
        )
        self.conn.execute(
            _NOTIFY, {"channel": EXECUTION_READY_CHANNEL, "payload": str(self.execution.id)}
        )
        return ExecutionStatus.PENDING

    def confirm(self) -> str:
        output, step = self.resolution.output, self.step
        if not isinstance(output, dict):
            raise DecisionInvalid("OUTPUT_INVALID", "confirm needs the step's output (an object)")
        problems = self.output_problems(step.capability, step.adapter_version, output)
        if problems:
            raise DecisionInvalid(
                "OUTPUT_INVALID", "the output breaks the adapter's output schema", problems
            )
        self.conn.execute(
            _CONFIRM_STEP,
            {"execution_id": self.execution.id, "action_id": step.action_id, "output": output},
        )
        return self._requeue()

    def retry(self) -> str:
        if self.step is not None:
            params = {"execution_id": self.execution.id, "action_id": self.step.action_id}
            self.conn.execute(_INTERRUPTED_INTO_HISTORY, params)
            self.conn.execute(_APPROVE_RETRY, {**params, "code": RETRY_APPROVED})
        return self._requeue()

    def fail(self) -> str:
        execution, step = self.execution, self.step
        flow = FlowDefinition.from_json(execution.definition)
        to_state = self.resolution.to_state
        if to_state is None and step is not None:
            transition = flow.transitions.get(execution.transition_id)
            actions = transition.actions if transition is not None else ()
            spec = next((a for a in actions if a.id == step.action_id), None)
            to_state = spec.on_error if spec is not None else None
        if to_state is not None and to_state not in flow.states:
            raise DecisionInvalid(
                "STATE_UNKNOWN", f"the flow has no state {to_state!r}", ["/toState"]
            )
        params = {"request_id": execution.request_id, "execution_id": execution.id}
        if to_state is not None and to_state != self.request.request_state:
            revision = self.conn.execute(_MOVE_REQUEST, {**params, "state": to_state}).scalar_one()
        else:
            revision = self.conn.execute(_RELEASE_REQUEST, params).scalar()
            to_state = self.request.request_state
        self.conn.execute(
            _END,
            {
                "execution_id": execution.id,
                "status": ExecutionStatus.FAILED,
                "error_code": execution.error_code,
                "result": {"outcome": "RECONCILED_FAILED", "toState": to_state},
            },
        )
        _audit(
            self.conn,
            execution,
            "TRANSITION_FAILED",
            self.resolution.actor,
            {
                "transitionId": execution.transition_id,
                "fromState": execution.accepted_state,
                "toState": to_state,
                "revision": revision,
                "errorCode": execution.error_code,
            },
        )
        return ExecutionStatus.FAILED


@dataclass(frozen=True)
class Cancelled:
    """What a cancel left: the execution's status, and what became of its machine commands.

    `requested`: the execution was RUNNING, so the cancel was recorded for its holder to
    apply when the step's call returns; the status is still RUNNING.
    """

    status: str
    commands: CancelledCommands
    requested: bool = False


def cancel(
    conn: Connection, execution_id: uuid.UUID, *, org_id: str, actor: str, reason: str
) -> Cancelled:
    """Cancel a live execution; the status it is left in.

    CANCELLED, with the request released in its accepted state, only when no write
    happened or may have happened in the execution (the write rule, read under the
    locks); otherwise RECONCILIATION_REQUIRED (CANCELLED_AFTER_WRITES) with the
    request still busy, for an operator to decide. A RUNNING one is not cut mid-call: the
    cancel is recorded as requested (the first request's who, why and when are kept) and
    its holder applies it when the call returns; it stays RUNNING. An ended or parked
    one is NotCancellable. Either way, in the same transaction, the execution's machine
    commands that no agent took are cancelled and those taken are asked to stop; the
    audit row names both.
    """
    with conn.begin():
        cancelled = cancel_in_transaction(conn, execution_id, org_id, actor, reason)
    if not cancelled.requested:
        metrics.count_move(cancelled.status)
    return cancelled


def cancel_in_transaction(
    conn: Connection,
    execution_id: uuid.UUID,
    org_id: str,
    actor: str,
    reason: str,
    *,
    bulk_id: uuid.UUID | None = None,
) -> Cancelled:
    """cancel() inside the caller's transaction, which commits it (a bulk item's outcome
    is recorded in the same one); counts nothing in the metrics. `bulk_id` names the bulk
    action in the audit row."""
    try:
        _request, execution = _lock(conn, execution_id, org_id)
    except NotReconcilable as missing:
        raise NotCancellable(missing.message) from None
    if execution.status == CANCEL_REQUESTABLE:
        return _request_cancel(conn, execution, actor, {"reason": reason, **_bulk_detail(bulk_id)})
    if execution.status not in UNHELD:
        raise NotCancellable(
            f"the execution is {execution.status}: only {', '.join(in_order(UNHELD))} executions"
            f" end by a cancel, and a {CANCEL_REQUESTABLE} one stops when its step's call"
            " returns"
        )
    writes = writes_of(conn, execution.id)
    commands = cancel_for_execution(conn, org_id=org_id, execution_id=execution.id)
    # A machine command no agent took, withdrawn above, is a write that did nothing.
    untaken = untaken_command_steps(conn, org_id=org_id, execution_id=execution.id)
    writes = replace(writes, succeeded=[a for a in writes.succeeded if a not in untaken])
    said = {"reason": reason, **_bulk_detail(bulk_id)}
    if writes.succeeded or writes.in_doubt:
        status = park_cancelled(conn, execution, actor, said, writes, commands)
    else:
        status = end_cancelled(conn, execution, actor, said, commands)
    return Cancelled(status, commands)


def _request_cancel(
    conn: Connection, execution: Any, actor: str, said: dict[str, str]
) -> Cancelled:
    """Record the cancel of a RUNNING execution for its holder, audited once.

    The call in flight is not cut. Its machine commands no agent took are withdrawn
    now and the taken ones asked to stop, so a wait's check sees them ended; the
    holder withdraws any its step wrote meanwhile when it applies the cancel.
    """
    commands = cancel_for_execution(conn, org_id=execution.org_id, execution_id=execution.id)
    first = execution.cancel_requested_at is None
    if first:
        conn.execute(
            _REQUEST_CANCEL,
            {"execution_id": execution.id, "actor": actor, "reason": said["reason"]},
        )
    if first or commands.cancelled or commands.stop_requested:
        _audit(
            conn,
            execution,
            CANCEL_REQUESTED,
            actor,
            {**said, "fromStatus": execution.status, "machineCommands": commands.as_json()},
        )
    log.info(
        "cancel requested: the step's call is running; its holder applies the cancel when"
        " the call returns",
        extra={"execution_id": str(execution.id)},
    )
    return Cancelled(CANCEL_REQUESTABLE, commands, requested=True)


def end_cancelled(
    conn: Connection,
    execution: Any,
    actor: str,
    said: dict[str, str],
    commands: CancelledCommands,
) -> str:
    params = {"request_id": execution.request_id, "execution_id": execution.id}
    conn.execute(_RELEASE_REQUEST, params)
    conn.execute(
        _END,
        {
            "execution_id": execution.id,
            "status": ExecutionStatus.CANCELLED,
            # The error code of a cancelled execution is its status.
            "error_code": ExecutionStatus.CANCELLED,
            "result": None,
        },
    )
    _audit(
        conn,
        execution,
        "EXECUTION_CANCELLED",
        actor,
        {
            **said,
            "fromStatus": execution.status,
            "machineCommands": commands.as_json(),
        },
    )
    return ExecutionStatus.CANCELLED


def park_cancelled(
    conn: Connection,
    execution: Any,
    actor: str,
    said: dict[str, str],
    writes: Writes,
    commands: CancelledCommands,
) -> str:
    # The execution's detail is what every reader of the execution sees: where it was
    # and which writes stop the cancel. The person and their words go to the audit row,
    # which only operators read, next to the checkpoints as they were.
    detail = {
        "fromStatus": execution.status,
        "writesSucceeded": writes.succeeded,
        "writesInDoubt": writes.in_doubt,
    }
    conn.execute(
        _PARK,
        {
            "execution_id": execution.id,
            "error_code": CANCELLED_AFTER_WRITES,
            "error_detail": detail,
        },
    )
    checkpoints = conn.execute(_CHECKPOINTS, {"execution_id": execution.id}).all()
    _audit(
        conn,
        execution,
        ExecutionStatus.RECONCILIATION_REQUIRED,  # the audit kind of a park is its status
        actor,
        {
            "reason": CANCELLED_AFTER_WRITES,
            "cancelReason": said["reason"],
            **{key: value for key, value in said.items() if key != "reason"},
            **detail,
            "machineCommands": commands.as_json(),
            "checkpoints": [_checkpoint_as_it_was(c) for c in checkpoints],
        },
    )
    log.warning(
        "cancel parked the execution for reconciliation: writes done or in doubt",
        extra={"execution_id": str(execution.id), "error_code": CANCELLED_AFTER_WRITES},
    )
    return ExecutionStatus.RECONCILIATION_REQUIRED
