"""States that continue by themselves: an execution remembers the one it continues.

Revision ID: 0030
Revises: 0029

Expand only: two columns and one index on execution.

- execution.continued_from: the execution whose finish moved the request into a state
  the flow continues from (`"continue"`), accepting this one in the same transaction;
  NULL for one a person, a schedule or an event asked for. At most one execution
  continues any other (a unique index), so even a defect cannot continue a finish twice.
- execution.continuations: how many continuations in a row, without a person, led to
  this execution (0 for one a person asked for); past MAX_CONTINUATIONS the next one is
  accepted parked (CONTINUATION_LIMIT) for a person to let it run.

The runtime role writes both with the INSERT it holds, and may UPDATE `continuations`:
an operator's retry of an execution parked at the limit starts the count again.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from orquestador.db.grants import restrict_updates, runtime_role

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_UPDATES_BEFORE = (
    "status",
    "attempts",
    "max_attempts",
    "fencing_token",
    "lease_owner",
    "lease_expires_at",
    "next_attempt_at",
    "result",
    "error_code",
    "error_detail",
    "wait_key",
    "started_at",
    "updated_at",
    "finished_at",
    "key_blocked",
    "accepted_revision",
)
_UPDATES_AFTER = (*_UPDATES_BEFORE, "continuations")


def upgrade() -> None:
    op.add_column("execution", sa.Column("continued_from", postgresql.UUID(as_uuid=True)))
    op.add_column(
        "execution",
        sa.Column("continuations", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index(
        "ux_execution_continued_from",
        "execution",
        ["continued_from"],
        unique=True,
        postgresql_where=sa.text("continued_from IS NOT NULL"),
    )
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_AFTER)


def downgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_BEFORE)
    op.drop_index("ux_execution_continued_from", table_name="execution")
    op.drop_column("execution", "continuations")
    op.drop_column("execution", "continued_from")
