"""A cancel asked of a RUNNING execution, applied by its holder once the step's call returned.

The API records the request (queue/reconciliation.py, `cancel_in_transaction`) and
never cuts a call: a write half sent is worse than a write done. The holder learns
of it when it next tries to go on: the batch writer refuses the next step's RUNNING
and the finish of an execution with a cancel requested (migration 0034), a retry or
a wait leaves it due at once, and a holder that loads it applies it before calling
anything. The holder then applies the cancel here, in one transaction under its
fence, by the write rule of every cancel: no write done or in doubt ends it
CANCELLED with the request released; otherwise it parks RECONCILIATION_REQUIRED
(`CANCELLED_AFTER_WRITES`, the writes listed). A stale holder applies nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sqlalchemy import Connection, text

from orquestador.machines.cancel import cancel_for_execution, untaken_command_steps
from orquestador.queue.fencing import FENCE, WORKER_ACTOR, Claim, refuse_stale, still_holds
from orquestador.queue.outcomes import writes_of
from orquestador.queue.reconciliation import end_cancelled, park_cancelled

log = logging.getLogger(__name__)

_LOCK_REQUEST = text("SELECT r.id FROM request r WHERE r.id = :request_id FOR UPDATE")

# The holder's execution, locked under its fence, with the cancel asked of it.
_LOCK_REQUESTED = text(
    f"""
    SELECT e.id, e.org_id, e.request_id, e.status, e.cancel_requested_at,
           e.cancel_requested_by, e.cancel_requested_reason
    FROM execution e
    WHERE {FENCE} AND e.cancel_requested_at IS NOT NULL
    FOR UPDATE
    """
)


def honour_cancel(conn: Connection, claim: Claim) -> str | None:
    """Apply the cancel requested of the claim's execution; the status it leaves.

    CANCELLED or RECONCILIATION_REQUIRED by the write rule; None when no cancel was
    requested. Raises LeaseLost when the claim no longer holds the lease: only the
    holder applies a requested cancel, and nothing of it is written otherwise.
    """
    with conn.begin():
        conn.execute(_LOCK_REQUEST, {"request_id": claim.request_id})
        execution = conn.execute(_LOCK_REQUESTED, claim.params).first()
        if execution is None:
            if still_holds(conn, claim):
                return None
            raise refuse_stale(claim, "apply the requested cancel")
        writes = writes_of(conn, execution.id)
        commands = cancel_for_execution(conn, org_id=execution.org_id, execution_id=execution.id)
        # A machine command no agent took, withdrawn above, is a write that did nothing.
        untaken = untaken_command_steps(conn, org_id=execution.org_id, execution_id=execution.id)
        writes = replace(writes, succeeded=[a for a in writes.succeeded if a not in untaken])
        said = {
            "reason": execution.cancel_requested_reason or "",
            "requestedAt": execution.cancel_requested_at.isoformat(),
            "appliedBy": WORKER_ACTOR,
        }
        actor = execution.cancel_requested_by or WORKER_ACTOR
        if writes.succeeded or writes.in_doubt:
            status = park_cancelled(conn, execution, actor, said, writes, commands)
        else:
            status = end_cancelled(conn, execution, actor, said, commands)
    log.info(
        "requested cancel applied after the step's call returned: %s",
        status,
        extra={**claim.log_extra, "status": status},
    )
    return status
