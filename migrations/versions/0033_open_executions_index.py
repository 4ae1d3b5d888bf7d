"""ix_execution_open: an organization's executions not ended, for the quota openExecutions.

Revision ID: 0033
Revises: 0032

Expand only: one partial index on execution (org_id) over the statuses that have not
ended (PENDING, RUNNING, RETRY_WAIT, WAITING, RECONCILIATION_REQUIRED). Each acceptance
counts the organization's open executions from it, up to the limit, instead of reading
its whole history. Built in the migration's transaction: on a large execution table it
holds writes to the table while it is built (docs/OPERATIONS.md#quotas).
"""

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_execution_open",
        "execution",
        ["org_id"],
        postgresql_where=sa.text(
            "status IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'WAITING', 'RECONCILIATION_REQUIRED')"
        ),
    )


def downgrade() -> None:
    op.drop_index("ix_execution_open", table_name="execution")
