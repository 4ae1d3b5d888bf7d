"""Who dismissed a notice: the panel's one-click dismiss is audited with its actor.

Revision ID: 0022
Revises: 0021

Expand only: one nullable column, `panel_notice.dismissed_by`, written with
`dismissed_at` by the first dismissal (a later one changes neither). The runtime role
may UPDATE `dismissed_at` and `dismissed_by` of panel_notice, nothing else.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import restrict_updates, runtime_role

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("panel_notice", sa.Column("dismissed_by", sa.Text()))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "panel_notice", ("dismissed_at", "dismissed_by"))


def downgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "panel_notice", ("dismissed_at",))
    op.drop_column("panel_notice", "dismissed_by")
