"""Bulk actions by query: an operator's cancel, retry or fail of every execution a filter matched.

Revision ID: 0018
Revises: 0017

Expand only: two new tables.

- bulk_action(id, org_id, actor, action, reason, filter, status, total, created_at,
  finished_at): one accepted bulk, RUNNING until every item has its outcome, then DONE.
  `ix_bulk_action_running` is where the worker looks for work.
- bulk_item(bulk_id, execution_id, outcome, code, detail, finished_at): the executions
  the filter matched when the bulk was accepted, written in the accepting transaction,
  so the set never changes afterwards. The worker acts on each item in a transaction of
  its own that takes the item FOR UPDATE SKIP LOCKED, acts on the execution under the
  normal rules and writes the item's outcome: a worker killed mid-item leaves the item
  as it was, and one acted on is never taken again. `ix_bulk_item_pending` holds the
  items nobody has acted on yet.

The runtime role may SELECT and INSERT both, UPDATE a bulk's `status` and `finished_at`
and an item's `outcome`, `code`, `detail` and `finished_at`; never an id, an
organization, an actor, an action or a filter.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_ACTION_UPDATES = ("status", "finished_at")
_ITEM_UPDATES = ("outcome", "code", "detail", "finished_at")


def upgrade() -> None:
    op.create_table(
        "bulk_action",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("filter", JSONB(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'RUNNING'")),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("clock_timestamp()"),
        ),
        sa.Column("finished_at", sa.TIMESTAMP(timezone=True)),
        sa.CheckConstraint("action IN ('cancel', 'retry', 'fail')", name="action"),
        sa.CheckConstraint("status IN ('RUNNING', 'DONE')", name="status"),
        sa.CheckConstraint(
            "(status = 'DONE') = (finished_at IS NOT NULL)", name="finished_iff_done"
        ),
    )
    op.create_index(
        "ix_bulk_action_running",
        "bulk_action",
        ["created_at"],
        postgresql_where=sa.text("status = 'RUNNING'"),
    )
    op.create_table(
        "bulk_item",
        sa.Column("bulk_id", UUID(as_uuid=True), sa.ForeignKey("bulk_action.id"), nullable=False),
        sa.Column(
            "execution_id", UUID(as_uuid=True), sa.ForeignKey("execution.id"), nullable=False
        ),
        sa.Column("outcome", sa.Text()),
        sa.Column("code", sa.Text()),
        sa.Column("detail", sa.Text()),
        sa.Column("finished_at", sa.TIMESTAMP(timezone=True)),
        sa.PrimaryKeyConstraint("bulk_id", "execution_id"),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('SUCCEEDED', 'PARKED', 'REFUSED')", name="outcome"
        ),
        sa.CheckConstraint(
            "(outcome IS NULL) = (finished_at IS NULL)", name="finished_iff_outcome"
        ),
        sa.CheckConstraint(
            "(outcome = 'SUCCEEDED') = (code IS NULL)", name="code_unless_succeeded"
        ),
    )
    op.create_index(
        "ix_bulk_item_pending",
        "bulk_item",
        ["bulk_id", "execution_id"],
        postgresql_where=sa.text("outcome IS NULL"),
    )
    op.create_index("ix_bulk_item_execution_id", "bulk_item", ["execution_id"])
    # DELETE: retention of finished bulks (BULK_RETENTION_DAYS).
    grant_runtime("bulk_action", ("SELECT", "INSERT", "DELETE"))
    grant_runtime("bulk_item", ("SELECT", "INSERT", "DELETE"))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "bulk_action", _ACTION_UPDATES)
        restrict_updates(op.get_bind(), role, "bulk_item", _ITEM_UPDATES)


def downgrade() -> None:
    op.drop_table("bulk_item")
    op.drop_table("bulk_action")
