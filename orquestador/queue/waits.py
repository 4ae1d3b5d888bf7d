"""Durable waits: an execution parked WAITING without a thread, woken by key or by time.

A READ_ONLY step whose answer is not there yet (the adapter raised NotReady) parks the
execution: its lease is given up, its job ends, and the claim takes it again once
`next_attempt_at` has passed, like a retry whose backoff ran out. `wake_waiting` moves
that time to now when what it waits for changes. A wait spends no attempt: the claim
does not count a WAITING row's next round, and the step's attempt goes on under the
same number with no line in the attempt history (a wait is not an ended attempt).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, text

from orquestador.db.schema import EXECUTION_READY_CHANNEL, JSONB_VALUE
from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.errors import ContractMismatch
from orquestador.queue.fencing import FENCE, Claim, refuse_stale, still_holds
from orquestador.queue.transactions import one_statement

# The error code a waiting step's checkpoint carries between rounds.
NOT_READY = "NOT_READY"
# A wait on a machine command: machines.commands.wait_key builds these keys.
COMMAND_WAIT_PREFIX = "machine_command:"
# A wait on a rollout's children: rollouts.store.wait_key builds these keys.
ROLLOUT_WAIT_PREFIX = "rollout:"

# One fenced statement: the step's RUNNING checkpoint pauses (FAILED with NOT_READY, its
# attempt number kept, what it saw stored) and the execution leaves RUNNING for WAITING
# with its lease cleared. The holder CTE locks the row under the fence, as every holder
# write does, and the outer UPDATE checks the fence again; both or neither happen.
_PARK = text(
    f"""
    WITH holder AS (
        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE
    ), paused AS (
        UPDATE action_execution AS a
        SET status = '{CheckpointStatus.FAILED}', error_code = '{NOT_READY}',
            finished_at = clock_timestamp(),
            -- The latest observation wins; a round that saw nothing keeps the last one.
            observed = coalesce(:observed, a.observed)
        FROM holder
        WHERE a.execution_id = holder.id AND a.action_id = :action_id
          AND a.status = '{CheckpointStatus.RUNNING}' AND a.fencing_token = :token
          -- Only a read may wait: nothing it did needs settling before the next round.
          AND a.effect = 'READ_ONLY'
        RETURNING a.action_id
    )
    UPDATE execution AS e
    SET status = '{ExecutionStatus.WAITING}', wait_key = :wait_key,
        -- A wake on the same key that landed while this round ran (after its claim) may
        -- be what the round did not see: due at once instead of after the delay.
        next_attempt_at = CASE
            -- A cancel asked while this round ran: due at once, and the next holder
            -- applies it before calling anything (queue/cancel_requests.py).
            WHEN e.cancel_requested_at IS NOT NULL THEN clock_timestamp()
            WHEN e.wait_key = :wait_key AND e.next_attempt_at > :claimed_at
            THEN clock_timestamp()
            -- A first round has no key on the row while it runs, so no wake marks it: it
            -- looks at the command itself. Changed since the claim, or no longer what the
            -- round saw (a report whose UPDATE ran before the claim and committed after
            -- the read): due at once too.
            WHEN EXISTS (
                SELECT 1 FROM machine_command c
                WHERE c.id = :command_id
                  AND (c.updated_at > :claimed_at OR c.status <> CAST(:seen_status AS text))
            )
            THEN clock_timestamp()
            -- A rollout's first round likewise: a child that ended (or a pause, a resume,
            -- a cancel) after the claim marks the rollout, not yet this row.
            WHEN EXISTS (
                SELECT 1 FROM rollout r WHERE r.id = :rollout_id AND r.changed_at > :claimed_at
            )
            THEN clock_timestamp()
            ELSE clock_timestamp() + make_interval(secs => :delay_seconds)
        END,
        lease_owner = NULL, lease_expires_at = NULL, error_code = NULL,
        updated_at = clock_timestamp()
    FROM paused
    WHERE {FENCE}
    RETURNING e.next_attempt_at
    """
).bindparams(bindparam("observed", type_=JSONB_VALUE))

# Due now: the claim takes a WAITING row once next_attempt_at has passed, so moving it
# to the present is all a wake needs. A round already RUNNING on the same key (a wait's
# second round or later keeps its key while it runs) is marked the same way: its park
# then sees the wake came after its claim and makes it due at once. One UPDATE covers
# both statuses on purpose: when a park is committing at the same moment, the row this
# statement found RUNNING is re-checked after the park's lock is gone and is WAITING by
# then; it must still match, or the wake would be lost between the two.
_WAKE = text(
    f"""
    WITH touched AS (
        UPDATE execution SET next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
        WHERE status IN ('{ExecutionStatus.WAITING}', '{ExecutionStatus.RUNNING}')
          AND wait_key = :wait_key
        RETURNING status
    )
    SELECT count(*) FILTER (WHERE status = '{ExecutionStatus.WAITING}') AS woken,
           count(*) FILTER (WHERE status = '{ExecutionStatus.RUNNING}') AS marked
    FROM touched
    """
)

_NOTIFY = text("SELECT pg_notify(:channel, '')")


def park_waiting(
    conn: Connection,
    claim: Claim,
    action_id: str,
    check_again_in: float,
    wait_key: str | None,
    observed: dict[str, Any] | None,
) -> datetime:
    """Park the execution WAITING on its RUNNING read `action_id`; when it is due again.

    LeaseLost if the claim is stale; ContractMismatch if the step's checkpoint is not a
    RUNNING read of this holder.
    """
    with one_statement(conn):
        row = conn.execute(
            _PARK,
            {
                **claim.params,
                "action_id": action_id,
                "wait_key": wait_key,
                "delay_seconds": float(check_again_in),
                "claimed_at": claim.claimed_at,
                "command_id": _id_after(COMMAND_WAIT_PREFIX, wait_key),
                "rollout_id": _id_after(ROLLOUT_WAIT_PREFIX, wait_key),
                # What the round saw of it (machine.wait's observation); NULL: not compared.
                "seen_status": (observed or {}).get("status"),
                "observed": observed or None,
            },
        ).first()
        if row is None:
            if not still_holds(conn, claim):
                raise refuse_stale(claim, f"park waiting on {action_id}")
            raise ContractMismatch(
                f"checkpoint {action_id} of execution {claim.execution_id} is not a RUNNING "
                "read of this holder; it cannot wait"
            )
    return row.next_attempt_at


def _id_after(prefix: str, wait_key: str | None) -> uuid.UUID | None:
    """The id a wait key names after `prefix` (a command, a rollout), or None."""
    if wait_key is None or not wait_key.startswith(prefix):
        return None
    try:
        return uuid.UUID(wait_key.removeprefix(prefix))
    except ValueError:
        return None


def wake_waiting(conn: Connection, wait_key: str) -> int:
    """Make every execution waiting on `wait_key` due now; how many there were.

    Runs in the caller's transaction, so the wake commits with the change that caused it
    (a command's new status, say). Workers hear of it through the ready channel once the
    transaction commits; no notification when nothing waits on the key. A change that
    lands while a later round on the same key runs makes that round's park due at once.
    A first round's key is on no row before its park, so no wake can mark it: its park
    reads the command's own `updated_at` instead, and a change after the claim makes it
    due at once all the same.
    """
    woken = int(conn.execute(_WAKE, {"wait_key": wait_key}).one().woken)
    if woken:
        conn.execute(_NOTIFY, {"channel": EXECUTION_READY_CHANNEL})
    return woken
