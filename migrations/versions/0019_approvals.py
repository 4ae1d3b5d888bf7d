"""Approvals: a person's decision as a durable wait (approval@1).

Revision ID: 0019
Revises: 0018

Expand only: one new table.

- approval: written by the step's first round, keyed by its external key (a repeat
  finds it); who may decide (`approver_subjects`, `approver_scope`), who never may
  (`requesters`: whoever asked for the transition and the request's owner), and the
  deadline. A decision through the API and the step closing it at its deadline are
  both conditional updates of the open row: the row lock orders them, and the second
  finds it closed.

The runtime role may SELECT and INSERT approval and UPDATE the columns that close it
(`status`, `decided_by`, `decided_at`, `comment`); what it asks and of whom never
changes.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approval",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("request_id", UUID(as_uuid=True), nullable=False),
        sa.Column("execution_id", UUID(as_uuid=True), nullable=False),
        sa.Column("action_id", sa.Text, nullable=False),
        sa.Column("external_key", sa.Text, nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column(
            "approver_subjects", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")
        ),
        sa.Column("approver_scope", sa.Text),
        sa.Column("requesters", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("deadline_at", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'open'")),
        sa.Column("decided_by", sa.Text),
        sa.Column("decided_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("comment", sa.Text),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.UniqueConstraint("external_key", name="uq_approval_external_key"),
        sa.CheckConstraint(
            "status IN ('open', 'approved', 'rejected', 'expired')", name="ck_approval_status"
        ),
        sa.CheckConstraint("(status = 'open') = (decided_at IS NULL)", name="ck_approval_decided"),
    )
    op.create_index(
        "ix_approval_org_id_status_created_at_id",
        "approval",
        ["org_id", "status", "created_at", "id"],
    )
    grant_runtime("approval", ("SELECT", "INSERT"))
    role = runtime_role()
    if role is not None:
        restrict_updates(
            op.get_bind(), role, "approval", ("status", "decided_by", "decided_at", "comment")
        )


def downgrade() -> None:
    op.drop_table("approval")
