"""plan_flow_binding: one flow per plan and moment, replacing hosting_plan.automation_flow_id.

Revision ID: 0004
Revises: 0003

The legacy column is copied using each flow's own trigger as the moment (not the
column's old meaning), then dropped in the same transaction, so there is no instant
where a plan's configuration lives nowhere. A flow whose trigger is not a moment
could never have run from a plan; it is reported and not bound.
"""

import logging

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

from orquestador.db.grants import grant_runtime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

log = logging.getLogger("orquestador.migrations")


def upgrade() -> None:
    op.create_table(
        "plan_flow_binding",
        sa.Column(
            "plan_id",
            UUID(as_uuid=True),
            sa.ForeignKey("hosting_plan.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("moment", sa.Text, nullable=False),
        sa.Column("flow_id", UUID(as_uuid=True), nullable=False),
        sa.PrimaryKeyConstraint("plan_id", "moment"),
        sa.CheckConstraint("moment IN ('provisioned', 'reinstalled', 'deleted')", name="moment"),
        sa.ForeignKeyConstraint(["flow_id", "moment"], ["flow.id", "flow.trigger"]),
    )
    bind = op.get_bind()
    unbound = bind.execute(
        sa.text(
            "SELECT p.id AS plan_id, p.name, f.id AS flow_id, f.key, f.trigger"
            " FROM hosting_plan p JOIN flow f ON f.id = p.automation_flow_id"
            " WHERE f.trigger NOT IN ('provisioned', 'reinstalled', 'deleted')"
            " ORDER BY p.id"
        )
    ).all()
    for row in unbound:
        log.warning(
            "plan %s (%s) not bound: flow %s (%s) has trigger %r, which is not a moment",
            row.plan_id,
            row.name,
            row.flow_id,
            row.key,
            row.trigger,
        )
    copied = bind.execute(
        sa.text(
            "INSERT INTO plan_flow_binding (plan_id, moment, flow_id)"
            " SELECT p.id, f.trigger, f.id"
            " FROM hosting_plan p JOIN flow f ON f.id = p.automation_flow_id"
            " WHERE f.trigger IN ('provisioned', 'reinstalled', 'deleted')"
        )
    ).rowcount
    log.info("plan_flow_binding: copied %d legacy binding(s), %d not bound", copied, len(unbound))
    op.drop_column("hosting_plan", "automation_flow_id")
    grant_runtime("plan_flow_binding", ("SELECT", "INSERT", "UPDATE", "DELETE"))


def downgrade() -> None:
    op.add_column(
        "hosting_plan",
        sa.Column("automation_flow_id", UUID(as_uuid=True), sa.ForeignKey("flow.id")),
    )
    # The legacy column holds one flow per plan: prefer the provisioned binding.
    dropped = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT count(*) FROM plan_flow_binding WHERE moment <> 'provisioned'"
                " AND plan_id IN (SELECT plan_id FROM plan_flow_binding GROUP BY plan_id"
                " HAVING count(*) > 1)"
            )
        )
        .scalar_one()
    )
    op.execute(
        "UPDATE hosting_plan p SET automation_flow_id = ("
        " SELECT b.flow_id FROM plan_flow_binding b WHERE b.plan_id = p.id"
        " ORDER BY b.moment = 'provisioned' DESC, b.moment LIMIT 1)"
    )
    if dropped:
        log.warning("downgrade keeps one flow per plan: %d other binding(s) dropped", dropped)
    op.drop_table("plan_flow_binding")
