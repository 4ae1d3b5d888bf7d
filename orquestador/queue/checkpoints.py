"""Checkpoint writes: one fenced statement each, so a stale holder's write changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Connection, bindparam, text

from orquestador.db.schema import JSONB_VALUE
from orquestador.domain.statuses import CheckpointStatus
from orquestador.errors import ContractMismatch
from orquestador.queue.fencing import FENCE, WORKER_ACTOR, Claim, refuse_stale, still_holds
from orquestador.queue.prepared import run_alone
from orquestador.queue.transactions import one_statement


@dataclass(frozen=True)
class ActionAttempt:
    """The identity of one attempt of one action, as its RUNNING checkpoint records it."""

    action_id: str
    attempt: int
    input_hash: str
    external_key: str
    effect: str
    capability: str
    adapter_version: int

    @property
    def params(self) -> dict[str, Any]:
        """Its fields as statement parameters (the RUNNING checkpoint's columns)."""
        return {
            "action_id": self.action_id,
            "attempt": self.attempt,
            "input_hash": self.input_hash,
            "external_key": self.external_key,
            "effect": self.effect,
            "capability": self.capability,
            "adapter_version": self.adapter_version,
        }


@dataclass(frozen=True)
class CheckpointOutcome:
    """How a RUNNING attempt ended, written together with what the execution does next."""

    action_id: str
    status: str  # FAILED or UNKNOWN
    error_code: str
    message: str | None = None  # safe and bounded (see attempt_message); never inputs
    # The adapter's lookup found no write under the key, so none of the action's
    # attempts so far took effect: the write rule stops counting them (attempt_base
    # moves to this attempt). Only where the action's budget no longer matters: the
    # attempt base also restarts it.
    settles_earlier: bool = False
    # What the step saw (an adapter's observe() or its error's observed), kept with the
    # checkpoint; None keeps what an earlier round of the step saw.
    observed: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in (CheckpointStatus.FAILED, CheckpointStatus.UNKNOWN):
            raise ValueError(f"an attempt ends FAILED or UNKNOWN, not {self.status}")
        if self.settles_earlier and self.status != CheckpointStatus.FAILED:
            raise ValueError("only an attempt that ends FAILED settles the earlier ones")


# Each statement locks the execution row through the `holder` CTE and checks the
# lease by clock_timestamp() once the lock is granted; it is the transaction's only
# statement, so the check at start is also the check just before commit. The row
# lock keeps a reclaimer (SKIP LOCKED) away until this write has committed.
_START = text(
    f"""
    WITH holder AS (
        -- The write exists only if this claim still holds the lease.
        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE
    ), interrupted AS (
        -- The attempt being replaced never reported its end (a crash, a lost lease):
        -- the history keeps it, as a write that may have happened unless it was a read.
        -- Same conditions as the replacement below, so both happen or neither does.
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT a.execution_id, a.action_id, a.attempt, a.fencing_token,
               CASE WHEN a.effect = 'READ_ONLY' THEN '{CheckpointStatus.FAILED}'
                    ELSE '{CheckpointStatus.UNKNOWN}' END,
               'INTERRUPTED', NULL, a.started_at, NULL
        FROM action_execution a, holder
        WHERE a.execution_id = holder.id AND a.action_id = :action_id
          AND a.status = '{CheckpointStatus.RUNNING}' AND a.external_key = :external_key
          AND a.effect <> 'NON_IDEMPOTENT_WRITE'
        ON CONFLICT DO NOTHING
    )
    INSERT INTO action_execution AS a (
        execution_id, action_id, status, attempt, fencing_token, input_hash, external_key,
        effect, capability, adapter_version, output, error_code, started_at, finished_at,
        first_started_at)
    SELECT holder.id, :action_id, '{CheckpointStatus.RUNNING}', :attempt, :token, :input_hash,
           :external_key,
           :effect, :capability, :adapter_version, NULL, NULL, clock_timestamp(), NULL,
           clock_timestamp()
    FROM holder
    ON CONFLICT (execution_id, action_id) DO UPDATE
    SET status = '{CheckpointStatus.RUNNING}', attempt = EXCLUDED.attempt,
        fencing_token = EXCLUDED.fencing_token,
        input_hash = EXCLUDED.input_hash, external_key = EXCLUDED.external_key,
        effect = EXCLUDED.effect, capability = EXCLUDED.capability,
        adapter_version = EXCLUDED.adapter_version, output = NULL, error_code = NULL,
        started_at = EXCLUDED.started_at, finished_at = NULL,
        -- Written by the step's first start only: later attempts, wait rounds and
        -- reclaims keep it, so a deadline measured from it survives them all.
        first_started_at = coalesce(a.first_started_at, EXCLUDED.first_started_at)
    -- A new attempt may replace a failed one or an interrupted safe one; never a success,
    -- never a different key, never an interrupted non-idempotent write.
    WHERE a.status <> '{CheckpointStatus.SUCCEEDED}'
      AND a.external_key = EXCLUDED.external_key
      AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE'
               AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}'))
    RETURNING a.action_id, a.first_started_at
    """
)

_SUCCEED_TEMPLATE = f"""
    WITH holder AS (
        -- Lock and check the lease: a late return after a reclaim records nothing.
        SELECT {{holder}} FROM execution e WHERE {{fence}} FOR UPDATE
    ), succeeded AS (
        UPDATE action_execution AS a
        SET status = '{CheckpointStatus.SUCCEEDED}', output = :output,
            finished_at = clock_timestamp(){{observed}}
        FROM holder
        -- Both key columns by value, so that any plan finds the row by its primary key.
        WHERE a.execution_id = :execution_id AND a.action_id = :action_id
          AND a.execution_id = holder.id
          AND a.status = '{CheckpointStatus.RUNNING}' AND a.fencing_token = :token
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                  a.finished_at
    ){{audit}}
    -- The attempt's line in the history, in the same statement as the checkpoint.
    INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                error_code, message, started_at, finished_at)
    SELECT execution_id, action_id, attempt, fencing_token, '{CheckpointStatus.SUCCEEDED}',
           NULL, NULL,
           started_at, finished_at
    FROM succeeded
    RETURNING action_id
    """

# A dry run's simulated call: the audit row saying what the step would have done goes
# with the checkpoint, in the same statement, so one is never without the other.
_SIMULATED_AUDIT = """, audited AS (
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT holder.org_id, 'ACTION_SIMULATED', holder.request_id, holder.id, :actor,
               :simulated
        FROM holder, succeeded
    )"""

# The hot path (no observation) keeps its statement as it was; the others set observed.
_SUCCEED = text(
    _SUCCEED_TEMPLATE.format(holder="e.id", fence=FENCE, observed="", audit="")
).bindparams(bindparam("output", type_=JSONB_VALUE))
_SUCCEED_OBSERVED = text(
    _SUCCEED_TEMPLATE.format(
        holder="e.id", fence=FENCE, observed=", observed = :observed", audit=""
    )
).bindparams(bindparam("output", type_=JSONB_VALUE), bindparam("observed", type_=JSONB_VALUE))
_SUCCEED_SIMULATED = text(
    _SUCCEED_TEMPLATE.format(
        holder="e.id, e.org_id, e.request_id",
        fence=FENCE,
        observed=", observed = coalesce(:observed, a.observed)",
        audit=_SIMULATED_AUDIT,
    )
).bindparams(
    bindparam("output", type_=JSONB_VALUE),
    bindparam("observed", type_=JSONB_VALUE),
    bindparam("simulated", type_=JSONB_VALUE),
)

# A safe step that wrote no RUNNING checkpoint before its call (SPEC 28): its attempt,
# whole, as it ended, with its line in the history. Under the same conditions as a
# start's upsert; the batch function's step 3 does the same per row (migration 0036).
_RECORD_SUCCESS = text(
    f"""
    WITH holder AS (
        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE
    ), recorded AS (
        INSERT INTO action_execution AS a (
            execution_id, action_id, status, attempt, fencing_token, input_hash, external_key,
            effect, capability, adapter_version, output, error_code, started_at, finished_at,
            first_started_at)
        SELECT holder.id, :action_id, '{CheckpointStatus.SUCCEEDED}', :attempt, :token,
               :input_hash, :external_key, :effect, :capability, :adapter_version, :output,
               NULL, :started_at, clock_timestamp(), :started_at
        FROM holder
        ON CONFLICT (execution_id, action_id) DO UPDATE
        SET status = '{CheckpointStatus.SUCCEEDED}', attempt = EXCLUDED.attempt,
            fencing_token = EXCLUDED.fencing_token, input_hash = EXCLUDED.input_hash,
            external_key = EXCLUDED.external_key, effect = EXCLUDED.effect,
            capability = EXCLUDED.capability, adapter_version = EXCLUDED.adapter_version,
            output = EXCLUDED.output, error_code = NULL, started_at = EXCLUDED.started_at,
            finished_at = EXCLUDED.finished_at,
            first_started_at = coalesce(a.first_started_at, EXCLUDED.first_started_at)
        WHERE a.status <> '{CheckpointStatus.SUCCEEDED}'
          AND a.external_key = :external_key
          AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE'
                   AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}'))
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                  a.finished_at
    )
    INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                error_code, message, started_at, finished_at)
    SELECT execution_id, action_id, attempt, fencing_token, '{CheckpointStatus.SUCCEEDED}',
           NULL, NULL, started_at, finished_at
    FROM recorded
    RETURNING action_id
    """
).bindparams(bindparam("output", type_=JSONB_VALUE))

_END_ATTEMPT = text(
    f"""
    WITH holder AS (
        -- Same fence as every holder write.
        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE
    ), ended AS (
        -- Only a RUNNING attempt ends: an ended one is history already.
        UPDATE action_execution AS a
        SET status = :status, error_code = :error_code, finished_at = clock_timestamp(),
            -- Settled by a lookup: the write rule counts only attempts after the base.
            attempt_base = CASE WHEN :settles THEN a.attempt ELSE a.attempt_base END,
            -- The latest observation wins; an attempt that saw nothing keeps the last one.
            observed = coalesce(:observed, a.observed)
        FROM holder
        WHERE a.execution_id = holder.id AND a.action_id = :action_id
          AND a.status = '{CheckpointStatus.RUNNING}'
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                  a.finished_at
    )
    INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                error_code, message, started_at, finished_at)
    SELECT execution_id, action_id, attempt, fencing_token, :status, :error_code, :message,
           started_at,
           -- An interrupted attempt was found, not seen ending.
           CASE WHEN :error_code = 'INTERRUPTED' THEN NULL ELSE finished_at END
    FROM ended
    RETURNING action_id
    """
).bindparams(bindparam("observed", type_=JSONB_VALUE))


# The adapter's lookup found the write: the step succeeded with the provider's output.
# Checkpoint, history line and audit row in one statement under the same fence.
_FOUND = text(
    f"""
    WITH holder AS (
        -- Lock and check the lease: a stale holder's lookup records nothing.
        SELECT e.id, e.org_id, e.request_id FROM execution e WHERE {FENCE} FOR UPDATE
    ), found AS (
        -- A RUNNING attempt is the one that wrote. An attempt that already ended has its
        -- line in the history, so the finding takes the next attempt number, this holder's.
        UPDATE action_execution AS a
        SET status = '{CheckpointStatus.SUCCEEDED}', output = :output, error_code = NULL,
            attempt = CASE WHEN a.status = '{CheckpointStatus.RUNNING}' THEN a.attempt
                           ELSE a.attempt + 1 END,
            fencing_token = CASE WHEN a.status = '{CheckpointStatus.RUNNING}' THEN a.fencing_token
                                 ELSE :token END,
            started_at = CASE WHEN a.status = '{CheckpointStatus.RUNNING}' THEN a.started_at
                              ELSE clock_timestamp() END,
            finished_at = clock_timestamp()
        FROM holder
        WHERE a.execution_id = :execution_id AND a.action_id = :action_id
          AND a.execution_id = holder.id
          AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}')
          AND a.external_key = :external_key
        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.external_key,
                  a.started_at, a.finished_at
    ), history AS (
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT execution_id, action_id, attempt, fencing_token, '{CheckpointStatus.SUCCEEDED}',
               NULL,
               'found by lookup: the provider has this write under the external key',
               started_at,
               -- Left RUNNING by an earlier holder: nobody saw the attempt end.
               CASE WHEN fencing_token = :token THEN finished_at END
        FROM found
    ), audited AS (
        -- Which step and key, never the output: that goes into the checkpoint only.
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT holder.org_id, 'RECONCILED_BY_LOOKUP', holder.request_id, holder.id, :actor,
               jsonb_build_object('actionId', found.action_id, 'attempt', found.attempt,
                                  'externalKey', found.external_key)
        FROM found, holder
    )
    SELECT attempt FROM found
    """
).bindparams(bindparam("output", type_=JSONB_VALUE))


def start_checkpoint(conn: Connection, claim: Claim, attempt: ActionAttempt) -> datetime:
    """Persist RUNNING before the adapter is called; the step's first start (database time).

    LeaseLost if the claim is stale.
    """
    row = run_alone(
        conn,
        _START,
        {**claim.params, **attempt.params},
    ).fetchone()
    if row is None:
        _refuse(conn, claim, attempt.action_id, "start checkpoint", "started again")
    return row.first_started_at


def _refuse(conn: Connection, claim: Claim, action_id: str, what: str, may_not: str) -> NoReturn:
    """A checkpoint write that changed nothing: LeaseLost if the claim is stale, else
    ContractMismatch (the step succeeded, has another key, or is an interrupted payment)."""
    with one_statement(conn):
        held = still_holds(conn, claim)
    if not held:
        raise refuse_stale(claim, f"{what} {action_id}")
    raise ContractMismatch(
        f"checkpoint {action_id} of execution {claim.execution_id} may not be {may_not} "
        "(succeeded, other key, or an interrupted non-idempotent write)"
    )


def succeed_checkpoint(
    conn: Connection,
    claim: Claim,
    action_id: str,
    output: Any,
    observed: dict[str, Any] | None = None,
    simulated: dict[str, Any] | None = None,
) -> None:
    """Persist the validated output as SUCCEEDED; LeaseLost if the claim is stale.

    `observed`: what the step saw, kept with the checkpoint. `simulated`: the detail of
    the ACTION_SIMULATED audit row written with it (a dry run's simulated call).
    """
    params: dict[str, Any] = {**claim.params, "action_id": action_id, "output": output}
    if simulated is not None:
        params.update(observed=observed or None, simulated=simulated, actor=WORKER_ACTOR)
        statement = _SUCCEED_SIMULATED
    elif observed:
        params["observed"] = observed
        statement = _SUCCEED_OBSERVED
    else:
        statement = _SUCCEED
    row = run_alone(conn, statement, params).fetchone()
    if row is None:
        raise refuse_stale(claim, f"succeed checkpoint {action_id}")


def record_success(
    conn: Connection, claim: Claim, attempt: ActionAttempt, started_at: datetime, output: Any
) -> None:
    """A safe step's whole attempt, SUCCEEDED, with no RUNNING checkpoint written before.

    The one-execution form of what the protocol writer writes for it (the reference of
    the pure-SQL baseline). LeaseLost if the claim is stale; ContractMismatch if the
    checkpoint may not be replaced (succeeded, another key, an interrupted payment).
    """
    params = {**claim.params, **attempt.params, "started_at": started_at, "output": output}
    row = run_alone(conn, _RECORD_SUCCESS, params).fetchone()
    if row is None:
        _refuse(conn, claim, attempt.action_id, "record success", "recorded")


def write_attempt_outcome(conn: Connection, claim: Claim, outcome: CheckpointOutcome) -> None:
    """Inside a caller's transaction: end the RUNNING attempt FAILED or UNKNOWN, with history."""
    row = conn.execute(
        _END_ATTEMPT,
        {
            **claim.params,
            "action_id": outcome.action_id,
            "status": outcome.status,
            "error_code": outcome.error_code,
            "message": outcome.message,
            "settles": outcome.settles_earlier,
            "observed": outcome.observed or None,
        },
    ).first()
    if row is None:
        if still_holds(conn, claim):
            raise ContractMismatch(
                f"checkpoint {outcome.action_id} of execution {claim.execution_id} is not "
                "RUNNING; its attempt cannot end again"
            )
        raise refuse_stale(claim, f"{outcome.status.lower()} checkpoint {outcome.action_id}")


def end_attempt(conn: Connection, claim: Claim, outcome: CheckpointOutcome) -> None:
    """As one statement of its own: end the RUNNING attempt FAILED or UNKNOWN, with history."""
    with one_statement(conn):
        write_attempt_outcome(conn, claim, outcome)


def record_found_write(
    conn: Connection,
    claim: Claim,
    *,
    action_id: str,
    external_key: str,
    output: Any,
    actor: str,
) -> int:
    """The lookup found the write: RUNNING/UNKNOWN checkpoint SUCCEEDED, history, audit.

    Returns the attempt the finding was recorded under. LeaseLost if the claim is
    stale; ContractMismatch if the checkpoint is not in doubt under this key.
    """
    with one_statement(conn):
        row = conn.execute(
            _FOUND,
            {
                **claim.params,
                "action_id": action_id,
                "external_key": external_key,
                "output": output,
                "actor": actor,
            },
        ).first()
        if row is None:
            if not still_holds(conn, claim):
                raise refuse_stale(claim, f"record found write {action_id}")
            raise ContractMismatch(
                f"checkpoint {action_id} of execution {claim.execution_id} is not a write in "
                "doubt under this key; a lookup's finding cannot be recorded on it"
            )
    return int(row.attempt)
