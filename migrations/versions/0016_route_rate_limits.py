"""Rate limits on routes: one token bucket per rate-limited route, shared by every worker.

Revision ID: 0016
Revises: 0015

Expand only: one new table.

- rate_bucket(name, tokens, refilled_at): the tokens a route had left when a call last
  took one (queue/rate_limits.py). A call takes a token in one upsert that refills the
  bucket for the time since `refilled_at` (at the route's `per_second`, up to its
  `burst`) and takes one only if one is there; the row lock of that upsert is what
  makes two workers share the bucket. The rate and the burst are not stored: they are
  the route's, read from the integrations file by whoever takes a token.

The runtime role may SELECT and INSERT rate_bucket and UPDATE `tokens` and
`refilled_at`; the name is the route's and never changes.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_bucket",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.TIMESTAMP(timezone=True), nullable=False),
    )
    grant_runtime("rate_bucket", ("SELECT", "INSERT"))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "rate_bucket", ("tokens", "refilled_at"))


def downgrade() -> None:
    op.drop_table("rate_bucket")
