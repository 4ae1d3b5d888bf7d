"""Dry runs that rehearse every path: the outcomes a dry run plays instead of its steps.

Revision ID: 0020
Revises: 0019

Expand only: one nullable column.

- execution.rehearsal: a dry run's `outcomes` (action id -> an output, an error code, a
  passed deadline or a person's decision), written with the execution and never changed.
  Only a dry run's execution may have them (a CHECK): a real run never plays an answer
  nobody gave.

The runtime role inserts it with the execution; it never updates it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("execution", sa.Column("rehearsal", JSONB))
    op.create_check_constraint(
        "rehearsal_in_dry_runs_only", "execution", "rehearsal IS NULL OR simulation"
    )


def downgrade() -> None:
    op.drop_constraint("rehearsal_in_dry_runs_only", "execution", type_="check")
    op.drop_column("execution", "rehearsal")
