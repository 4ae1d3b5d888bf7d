"""ix_execution_listing: an organization's executions, newest first.

Revision ID: 0007
Revises: 0006

`GET /executions` pages through one organization's executions by (created_at, id)
descending; without this index every page sorts the organization's whole history.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_execution_listing",
        "execution",
        ["org_id", "created_at", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_execution_listing", table_name="execution")
