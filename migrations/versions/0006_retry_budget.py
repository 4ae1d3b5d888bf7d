"""action_execution.attempt_base: where an operator's approved retry restarts the budget.

Revision ID: 0006
Revises: 0005

An operator who decides that a parked step's effect did not happen lets it run
again with a fresh attempt budget. Attempt numbers keep counting (the history is
keyed by them); the budget counts attempts after this base.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "action_execution",
        sa.Column("attempt_base", sa.Integer, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("action_execution", "attempt_base")
