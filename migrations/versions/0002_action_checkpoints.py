"""Action checkpoints (action_execution), keyed by execution and action.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from orquestador.db.grants import grant_runtime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "action_execution",
        sa.Column(
            "execution_id", UUID(as_uuid=True), sa.ForeignKey("execution.id"), nullable=False
        ),
        sa.Column("action_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("input_hash", sa.Text, nullable=False),
        sa.Column("external_key", sa.Text, nullable=False),
        sa.Column("capability", sa.Text, nullable=False),
        sa.Column("adapter_version", sa.Integer, nullable=False),
        sa.Column("output", JSONB),
        sa.Column("error_code", sa.Text),
        sa.Column(
            "started_at",
            TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("clock_timestamp()"),
        ),
        sa.Column("finished_at", TIMESTAMP(timezone=True)),
        sa.PrimaryKeyConstraint("execution_id", "action_id"),
        sa.UniqueConstraint("external_key"),
        sa.CheckConstraint(
            "status IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')", name="status"
        ),
    )
    grant_runtime("action_execution", ("SELECT", "INSERT", "UPDATE"))


def downgrade() -> None:
    op.drop_table("action_execution")
