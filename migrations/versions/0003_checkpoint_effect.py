"""action_execution.effect; checkpoints written before it count as non-idempotent writes.

Revision ID: 0003
Revises: 0002

Nothing recorded which effect an older checkpoint had, so the backfill assumes the
worst: a write that must never be repeated behind anyone's back.

"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("action_execution", sa.Column("effect", sa.Text, nullable=True))
    op.execute("UPDATE action_execution SET effect = 'NON_IDEMPOTENT_WRITE' WHERE effect IS NULL")
    op.alter_column("action_execution", "effect", nullable=False)
    op.create_check_constraint(
        "effect",
        "action_execution",
        "effect IN ('READ_ONLY', 'IDEMPOTENT_WRITE', 'NON_IDEMPOTENT_WRITE')",
    )


def downgrade() -> None:
    # Dropping the column drops its check constraint with it.
    op.drop_column("action_execution", "effect")
