"""Base schema: flows, requests, executions, audit, machine commands, plans, notices.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from orquestador.db.grants import grant_runtime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOW = sa.text("now()")


def _id() -> sa.Column:
    return sa.Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
    )


def _ts(name: str, default: sa.TextClause | None = NOW, nullable: bool = False) -> sa.Column:
    return sa.Column(name, TIMESTAMP(timezone=True), nullable=nullable, server_default=default)


def upgrade() -> None:
    op.create_table(
        "flow",
        _id(),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("trigger", sa.Text, nullable=False),
        sa.Column("definition", JSONB, nullable=False),
        sa.Column("data_schema", JSONB, nullable=False),
        sa.Column("created_by", sa.Text, nullable=False),
        _ts("created_at"),
        sa.UniqueConstraint("org_id", "key", "version"),
        sa.UniqueConstraint("id", "trigger"),
        sa.CheckConstraint(
            "trigger IN ('manual', 'webhook', 'provisioned', 'reinstalled', 'deleted')",
            name="trigger",
        ),
        sa.CheckConstraint("version >= 1", name="version_positive"),
    )
    op.create_table(
        "request",
        _id(),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("owner_id", sa.Text, nullable=False),
        sa.Column("flow_id", UUID(as_uuid=True), sa.ForeignKey("flow.id"), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("data", JSONB, nullable=False),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column("acl", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("machine_id", sa.Text),
        sa.Column("busy_execution_id", UUID(as_uuid=True)),
        _ts("created_at"),
        _ts("updated_at"),
    )
    op.create_index(None, "request", ["org_id", "owner_id"])
    op.create_table(
        "execution",
        _id(),
        sa.Column("request_id", UUID(as_uuid=True), sa.ForeignKey("request.id"), nullable=False),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("flow_id", UUID(as_uuid=True), sa.ForeignKey("flow.id"), nullable=False),
        sa.Column("transition_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'PENDING'")),
        sa.Column("accepted_revision", sa.Integer, nullable=False),
        sa.Column("accepted_state", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("10")),
        sa.Column("fencing_token", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_owner", sa.Text),
        _ts("lease_expires_at", None, nullable=True),
        _ts("next_attempt_at"),
        sa.Column("simulation", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("actor_snapshot", JSONB, nullable=False),
        sa.Column("result", JSONB),
        sa.Column("error_code", sa.Text),
        _ts("created_at", sa.text("clock_timestamp()")),
        _ts("started_at", None, nullable=True),
        _ts("updated_at"),
        _ts("finished_at", None, nullable=True),
        sa.CheckConstraint(
            "status IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED', "
            "'RECONCILIATION_REQUIRED', 'CANCELLED')",
            name="status",
        ),
        sa.CheckConstraint(
            "(status = 'RUNNING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="lease_iff_running",
        ),
    )
    op.create_index(
        "ix_execution_due",
        "execution",
        ["next_attempt_at", "created_at", "id"],
        postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT')"),
    )
    op.create_index(
        "ix_execution_lease",
        "execution",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'RUNNING'"),
    )
    op.create_index(None, "execution", ["request_id"])
    op.create_foreign_key(None, "request", "execution", ["busy_execution_id"], ["id"])
    op.create_table(
        "audit_event",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("request_id", UUID(as_uuid=True)),
        sa.Column("execution_id", UUID(as_uuid=True)),
        sa.Column("actor", sa.Text),
        sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        _ts("created_at", sa.text("clock_timestamp()")),
    )
    op.create_index(None, "audit_event", ["execution_id"])
    op.create_index(None, "audit_event", ["request_id"])
    op.create_table(
        "machine_command",
        _id(),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("machine_id", sa.Text, nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("external_key", sa.Text, nullable=False),
        sa.Column("result", JSONB),
        sa.Column("simulation", sa.Boolean, nullable=False, server_default=sa.text("false")),
        _ts("created_at"),
        _ts("updated_at"),
        sa.UniqueConstraint("external_key"),
        sa.CheckConstraint(
            "status IN ('pending', 'sent', 'running', 'succeeded', 'failed', 'timed_out')",
            name="status",
        ),
    )
    op.create_index(None, "machine_command", ["org_id", "machine_id", "status"])
    op.create_table(
        "hosting_plan",
        _id(),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        # Legacy: "run this flow when a machine is provisioned"; revision 0004 replaces it.
        sa.Column("automation_flow_id", UUID(as_uuid=True), sa.ForeignKey("flow.id")),
        _ts("created_at"),
    )
    op.create_table(
        "panel_notice",
        _id(),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("request_id", UUID(as_uuid=True)),
        sa.Column("execution_id", UUID(as_uuid=True)),
        sa.Column("external_key", sa.Text, nullable=False),
        sa.Column("test", sa.Boolean, nullable=False, server_default=sa.text("false")),
        _ts("created_at"),
        _ts("read_at", None, nullable=True),
        sa.UniqueConstraint("external_key"),
    )
    op.create_index(None, "panel_notice", ["org_id", "created_at"])
    op.create_table(
        "notification_opt_out",
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("channel", sa.Text, nullable=False, server_default=sa.text("'email'")),
        sa.PrimaryKeyConstraint("org_id", "category", "channel"),
    )
    grant_runtime("flow", ("SELECT", "INSERT"))
    grant_runtime("request", ("SELECT", "INSERT", "UPDATE"))
    grant_runtime("execution", ("SELECT", "INSERT", "UPDATE"))
    grant_runtime("audit_event", ("SELECT", "INSERT"))
    grant_runtime("machine_command", ("SELECT", "INSERT", "UPDATE", "DELETE"))
    grant_runtime("hosting_plan", ("SELECT", "INSERT", "UPDATE", "DELETE"))
    grant_runtime("panel_notice", ("SELECT", "INSERT", "UPDATE", "DELETE"))
    grant_runtime("notification_opt_out", ("SELECT", "INSERT", "DELETE"))


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_request_busy_execution_id_execution"), "request", type_="foreignkey"
    )
    for table in (
        "notification_opt_out",
        "panel_notice",
        "hosting_plan",
        "machine_command",
        "audit_event",
        "execution",
        "request",
        "flow",
    ):
        op.drop_table(table)
