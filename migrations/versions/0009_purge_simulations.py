"""purge_simulations(), the one way the runtime role deletes requests and executions; an
index for the reconciliation queue.

Revision ID: 0009
Revises: 0008

Requests, executions, checkpoints and attempt history are append-only history: the
runtime role has no DELETE on them. Dry runs (simulated requests) are the exception:
they are purged after SIMULATION_RETENTION_DAYS. This function, owned by the owner
role and run with its rights (SECURITY DEFINER), deletes only simulated requests whose
executions have all ended, with their executions, checkpoints and attempts; audit rows
stay. The runtime role may call it and nothing else, so a real request stays
undeletable by the runtime role.

ix_execution_reconciliation: the maintenance loop counts RECONCILIATION_REQUIRED
executions every pass; without it each count reads the whole execution table.
"""

from alembic import op
from sqlalchemy import text

from orquestador.db.grants import runtime_role
from orquestador.db.schema import PURGE_SIMULATIONS_FUNCTION

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_SIGNATURE = f"{PURGE_SIMULATIONS_FUNCTION}(interval, integer)"


def upgrade() -> None:
    op.create_index(
        "ix_execution_reconciliation",
        "execution",
        ["created_at"],
        postgresql_where=text("status = 'RECONCILIATION_REQUIRED'"),
    )
    # search_path is pinned to the migration's own, so a caller cannot point the
    # function at tables of its choosing.
    op.execute(
        text(
            f"""
            CREATE FUNCTION {_SIGNATURE} RETURNS integer
            LANGUAGE plpgsql
            SECURITY DEFINER
            SET search_path FROM CURRENT
            AS $$
            DECLARE
                purged uuid[];
            BEGIN
                SELECT coalesce(array_agg(r.id), '{{}}') INTO purged
                FROM (
                    SELECT r.id
                    FROM request r
                    WHERE r.simulation
                      AND r.created_at < now() - $1
                      AND NOT EXISTS (
                          SELECT 1 FROM execution e
                          WHERE e.request_id = r.id
                            AND (NOT e.simulation OR e.finished_at IS NULL)
                      )
                    ORDER BY r.created_at
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED
                ) r;
                UPDATE request SET busy_execution_id = NULL
                    WHERE id = ANY(purged) AND busy_execution_id IS NOT NULL;
                DELETE FROM action_attempt a USING execution e
                    WHERE a.execution_id = e.id AND e.request_id = ANY(purged);
                DELETE FROM action_execution c USING execution e
                    WHERE c.execution_id = e.id AND e.request_id = ANY(purged);
                DELETE FROM execution WHERE request_id = ANY(purged);
                DELETE FROM request WHERE id = ANY(purged);
                RETURN cardinality(purged);
            END
            $$
            """
        )
    )
    op.execute(text(f"REVOKE ALL ON FUNCTION {_SIGNATURE} FROM PUBLIC"))
    role = runtime_role()
    if role is not None:
        quoted = op.get_bind().dialect.identifier_preparer.quote(role)
        op.execute(text(f"GRANT EXECUTE ON FUNCTION {_SIGNATURE} TO {quoted}"))


def downgrade() -> None:
    op.execute(text(f"DROP FUNCTION {_SIGNATURE}"))
    op.drop_index("ix_execution_reconciliation", table_name="execution")
