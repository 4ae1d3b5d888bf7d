"""Loading a claimed execution: accepted snapshot, current request, pinned flow, checkpoints."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from orquestador.queue.fencing import FENCE, Claim, refuse_stale
from orquestador.queue.prepared import run_alone
from orquestador.queue.snapshots import Checkpoint, LoadedExecution
from orquestador.queue.transactions import one_statement

# Read under the fence: a worker whose token moved on cannot even load.
_LOAD = text(
    f"""
    SELECT e.id, e.request_id, e.org_id, e.flow_id, e.transition_id, e.accepted_state,
           e.accepted_revision, e.attempts, e.max_attempts, e.simulation, e.created_at,
           e.actor_snapshot ->> 'sub' AS actor,
           e.cancel_requested_at IS NOT NULL AS cancel_requested,
           r.state AS request_state, r.revision AS request_revision,
           r.flow_id AS request_flow_id, r.busy_execution_id, r.owner_id, r.data,
           f.version AS flow_version, f.definition, f.data_schema,
           coalesce(
               (SELECT jsonb_agg(jsonb_build_object(
                           'action_id', a.action_id, 'status', a.status, 'attempt', a.attempt,
                           'fencing_token', a.fencing_token, 'input_hash', a.input_hash,
                           'external_key', a.external_key, 'effect', a.effect,
                           'capability', a.capability, 'adapter_version', a.adapter_version,
                           'output', a.output, 'error_code', a.error_code,
                           'attempt_base', a.attempt_base,
                           'first_started_at', a.first_started_at, 'observed', a.observed))
                FROM action_execution a WHERE a.execution_id = e.id),
               '[]'::jsonb) AS checkpoints
    FROM execution e
    JOIN request r ON r.id = e.request_id
    JOIN flow f ON f.id = e.flow_id
    WHERE {FENCE}
    """
)


def load_execution(conn: Connection, claim: Claim) -> LoadedExecution:
    """Everything needed to run the claim; LeaseLost when the claim no longer holds the lease."""
    row = run_alone(conn, _LOAD, claim.params).fetchone()
    if row is None:
        raise refuse_stale(claim, "load")
    checkpoints = {c["action_id"]: Checkpoint.from_json(c) for c in row.checkpoints}
    return LoadedExecution.from_row(row, checkpoints)


_REHEARSAL = text(f"SELECT e.rehearsal FROM execution e WHERE {FENCE}")


def load_rehearsal(conn: Connection, claim: Claim) -> dict[str, Any]:
    """A dry run's outcomes by action id ({} for none), read under the fence.

    Read only for dry runs, when a step is about to be simulated: the real runs' hot
    path never pays for it.
    """
    with one_statement(conn):
        row = conn.execute(_REHEARSAL, claim.params).first()
    if row is None:
        raise refuse_stale(claim, "load the dry run's outcomes")
    return dict(row.rehearsal or {})
