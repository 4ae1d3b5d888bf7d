"""action_attempt: every ended attempt of an action; execution.error_detail.

Revision ID: 0005
Revises: 0004

The checkpoint row holds only the latest attempt of an action, so an attempt whose
write may have happened (UNKNOWN, or interrupted) was forgotten once a later attempt
failed, and the request could be released as FAILED. The history keeps every attempt;
the runtime role may only insert and read it.

Existing checkpoints that already ended seed the history with their latest attempt,
so an UNKNOWN recorded before this revision still counts. JSON `null` stored where
SQL NULL was meant (execution.result) becomes NULL.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "action_attempt",
        sa.Column("execution_id", UUID(as_uuid=True), nullable=False),
        sa.Column("action_id", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error_code", sa.Text),
        sa.Column("message", sa.Text),
        sa.Column("started_at", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("finished_at", sa.TIMESTAMP(timezone=True)),
        sa.PrimaryKeyConstraint("execution_id", "action_id", "attempt"),
        sa.ForeignKeyConstraint(
            ["execution_id", "action_id"],
            ["action_execution.execution_id", "action_execution.action_id"],
        ),
        sa.CheckConstraint("status IN ('SUCCEEDED', 'FAILED', 'UNKNOWN')", name="status"),
        sa.CheckConstraint("length(message) <= 1024", name="message_length"),
    )
    op.execute(
        """
        INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token, status,
                                    error_code, message, started_at, finished_at)
        SELECT execution_id, action_id, attempt, fencing_token, status, error_code, NULL,
               started_at, finished_at
        FROM action_execution
        WHERE status <> 'RUNNING'
        """
    )
    grant_runtime("action_attempt", ("SELECT", "INSERT"))
    op.add_column("execution", sa.Column("error_detail", JSONB))
    op.execute("UPDATE execution SET result = NULL WHERE result = 'null'::jsonb")


def downgrade() -> None:
    op.drop_column("execution", "error_detail")
    op.drop_table("action_attempt")
