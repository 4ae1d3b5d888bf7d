"""Arranging many executions at once for the bulk action tests, with plain SQL as the API would."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Connection, Engine, text

from tests.integration.worker_support import ORG, OWNER, action, flow_definition

# The step a parked execution is in doubt about, and where a failed one's request goes.
STEP = "charge"
ON_ERROR = "attention"


def publish(engine: Engine, org: str = ORG) -> uuid.UUID:
    """A flow of `org` whose one transition charges once (onError: attention)."""
    definition = flow_definition([action(STEP, "test.charge", onError=ON_ERROR)])
    with engine.begin() as conn:
        return conn.execute(
            text("""INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                      created_by)
                    VALUES (:org, :key, 1, 'manual', CAST(:definition AS jsonb),
                            CAST(:schema AS jsonb), 'tester')
                    RETURNING id"""),
            {
                "org": org,
                "key": definition["key"],
                "definition": json.dumps(definition),
                "schema": json.dumps(definition["dataSchema"]),
            },
        ).scalar_one()


def arrange(
    engine: Engine,
    flow_id: uuid.UUID,
    count: int,
    *,
    org: str = ORG,
    status: str = "PENDING",
    machine_id: str | None = None,
    checkpoint: str | None = None,
    error_code: str | None = None,
    simulation: bool = False,
) -> list[uuid.UUID]:
    """`count` requests of the flow, each busy with one execution in `status`, in id order.

    None is due: no worker claims them while a test runs its bulk. A RUNNING one holds a
    lease of another worker; `simulation` makes them dry runs. `checkpoint` gives each a
    step `charge` (a write) in that status: SUCCEEDED is a write done, UNKNOWN one in
    doubt (a parked execution's).
    """
    with engine.begin() as conn:
        rows = conn.execute(
            text("""
            WITH requests AS (
                INSERT INTO request (org_id, owner_id, flow_id, state, revision, data,
                                     created_by, machine_id, simulation)
                SELECT :org, :owner, :flow, 'new', 2, '{}'::jsonb, :owner, :machine, :simulation
                FROM generate_series(1, :count)
                RETURNING id
            )
            INSERT INTO execution (request_id, org_id, flow_id, transition_id,
                                   accepted_revision, accepted_state, actor_snapshot, status,
                                   error_code, next_attempt_at, lease_owner, lease_expires_at,
                                   simulation)
            SELECT id, :org, :flow, 'go', 2, 'new', CAST(:actor AS jsonb), :status,
                   :error_code, now() + interval '1 day',
                   CASE WHEN :status = 'RUNNING' THEN 'another-worker' END,
                   CASE WHEN :status = 'RUNNING' THEN now() + interval '1 hour' END,
                   :simulation
            FROM requests
            RETURNING id, request_id
            """),
            {
                "org": org,
                "owner": OWNER,
                "flow": flow_id,
                "machine": machine_id,
                "count": count,
                "actor": json.dumps({"sub": OWNER}),
                "status": status,
                "error_code": error_code,
                "simulation": simulation,
            },
        ).all()
        conn.execute(
            text("""UPDATE request r SET busy_execution_id = e.id
                    FROM execution e WHERE e.request_id = r.id AND e.id = ANY(:ids)"""),
            {"ids": [row.id for row in rows]},
        )
        if checkpoint is not None:
            _checkpoints(conn, [row.id for row in rows], checkpoint)
    return sorted(row.id for row in rows)


def _checkpoints(conn: Connection, ids: list[uuid.UUID], status: str) -> None:
    conn.execute(
        text("""INSERT INTO action_execution (execution_id, action_id, status, attempt,
                                              fencing_token, input_hash, external_key, effect,
                                              capability, adapter_version, finished_at)
                SELECT id, :step, :status, 1, 1, 'hash', id::text || ':' || :step,
                       'NON_IDEMPOTENT_WRITE', 'test.charge', 1,
                       CASE WHEN :status = 'SUCCEEDED' THEN now() END
                FROM unnest(CAST(:ids AS uuid[])) AS id"""),
        {"ids": ids, "step": STEP, "status": status},
    )


def parked(engine: Engine, flow_id: uuid.UUID, count: int, **options: Any) -> list[uuid.UUID]:
    """Executions parked RECONCILIATION_REQUIRED with the step `charge` in doubt."""
    return arrange(
        engine,
        flow_id,
        count,
        status="RECONCILIATION_REQUIRED",
        checkpoint="UNKNOWN",
        error_code="UNCERTAIN_OUTCOME",
        **options,
    )


def audits(engine: Engine, kind: str) -> dict[uuid.UUID, list[Any]]:
    """The audit rows of one kind, by execution."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM audit_event WHERE kind = :kind ORDER BY id"), {"kind": kind}
        ).all()
    found: dict[uuid.UUID, list[Any]] = {}
    for row in rows:
        found.setdefault(row.execution_id, []).append(row)
    return found


def statuses(engine: Engine, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, status FROM execution WHERE id = ANY(:ids)"), {"ids": ids}
        ).all()
    return {row.id: row.status for row in rows}


def items(engine: Engine, bulk_id: uuid.UUID | str) -> dict[uuid.UUID, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM bulk_item WHERE bulk_id = :id"), {"id": uuid.UUID(str(bulk_id))}
        ).all()
    return {row.execution_id: row for row in rows}


def table_counts(engine: Engine) -> tuple[int, int]:
    """(bulk actions, bulk items) in the database."""
    with engine.connect() as conn:
        return (
            conn.execute(text("SELECT count(*) FROM bulk_action")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM bulk_item")).scalar_one(),
        )
