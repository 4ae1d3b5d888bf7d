"""Traces across the queue: the W3C `traceparent` an execution and an e-mail continue.

Revision ID: 0025
Revises: 0024

Expand only: two nullable text columns, metadata-only changes on PostgreSQL (no
rewrite, no backfill: what was accepted before has no trace to continue).

- execution.trace_parent: the acceptance's span, written with the execution; the claim
  returns it and each holder's spans continue that trace.
- email_outbox.trace_parent: the span of the step that queued the e-mail; the mailer's
  delivery continues it.

Both are written only by the INSERT the runtime role already holds on these tables and
never updated, so no grant changes. A column of their own rather than a key in a JSON
column: `actor_snapshot` is who accepted, `rehearsal` exists only on dry runs, and the
outbox row has no JSON column of that kind.
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("execution", sa.Column("trace_parent", sa.Text()))
    op.add_column("email_outbox", sa.Column("trace_parent", sa.Text()))


def downgrade() -> None:
    op.drop_column("email_outbox", "trace_parent")
    op.drop_column("execution", "trace_parent")
