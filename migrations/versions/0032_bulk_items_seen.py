"""A bulk item remembers the execution as the bulk found it.

Revision ID: 0032
Revises: 0031

Expand only: one nullable column on bulk_item.

- bulk_item.seen_updated_at: the execution's `updated_at` when the bulk was accepted
  (written by the accepting statement). A decision item (retry, fail) whose execution has
  changed since (a new park, another decision) is refused STALE_ITEM instead of deciding
  about a doubt nobody saw. NULL for items accepted before this revision: they are acted
  on as before.

The runtime role writes it with the INSERT it holds and never updates it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("bulk_item", sa.Column("seen_updated_at", sa.TIMESTAMP(timezone=True)))


def downgrade() -> None:
    op.drop_column("bulk_item", "seen_updated_at")
