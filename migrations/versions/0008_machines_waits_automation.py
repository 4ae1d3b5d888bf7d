"""Durable waits, machine commands, plan keys, platform events, notices and e-mail.

Revision ID: 0008
Revises: 0007

Expand only: new columns have defaults or are nullable, new tables are empty, and an
older worker keeps working beside a newer one (it never claims WAITING rows).

- execution: status WAITING, `wait_key` (what a WAITING execution waits for); the due
  index covers WAITING so the claim finds waits that ran out.
- action_execution: `first_started_at` (a step's own deadline survives retries and
  reclaims) and `observed` (what the step saw, frozen into the audit).
- machine_command: args, exit code, output, sent and finished times.
- hosting_plan.key: the platform's own plan id, unique per organization (existing
  plans get their uuid as key).
- request.simulation; panel_notice severity, e-mail outcome and dismissal;
  notification_preference (recipients), email_outbox, platform_event.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_OLD_STATUSES = (
    "'PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED', "
    "'RECONCILIATION_REQUIRED', 'CANCELLED'"
)
_NEW_STATUSES = (
    "'PENDING', 'RUNNING', 'RETRY_WAIT', 'WAITING', 'SUCCEEDED', 'FAILED', "
    "'RECONCILIATION_REQUIRED', 'CANCELLED'"
)


def _ts(name: str, default: str | None = None, nullable: bool = True) -> sa.Column:
    server_default = sa.text(default) if default else None
    return sa.Column(
        name, sa.TIMESTAMP(timezone=True), nullable=nullable, server_default=server_default
    )


def upgrade() -> None:
    # --- durable waits --------------------------------------------------------------
    op.drop_constraint("status", "execution", type_="check")
    op.create_check_constraint("status", "execution", f"status IN ({_NEW_STATUSES})")
    op.add_column("execution", sa.Column("wait_key", sa.Text))
    op.drop_index("ix_execution_due", table_name="execution")
    op.create_index(
        "ix_execution_due",
        "execution",
        ["next_attempt_at", "created_at", "id"],
        postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT', 'WAITING')"),
    )
    op.create_index(
        "ix_execution_wait_key",
        "execution",
        ["wait_key"],
        postgresql_where=sa.text("status = 'WAITING'"),
    )
    op.add_column("action_execution", _ts("first_started_at"))
    op.execute("UPDATE action_execution SET first_started_at = started_at")
    op.add_column("action_execution", sa.Column("observed", JSONB))

    # --- machine commands -----------------------------------------------------------
    op.add_column(
        "machine_command",
        sa.Column("args", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    )
    op.add_column("machine_command", sa.Column("exit_code", sa.Integer))
    op.add_column("machine_command", sa.Column("output", sa.Text))
    op.add_column("machine_command", _ts("sent_at"))
    op.add_column("machine_command", _ts("finished_at"))
    op.execute(
        "UPDATE machine_command SET finished_at = updated_at"
        " WHERE status IN ('succeeded', 'failed', 'timed_out')"
    )
    op.create_index(
        "ix_machine_command_finished",
        "machine_command",
        ["finished_at"],
        postgresql_where=sa.text("status IN ('succeeded', 'failed', 'timed_out')"),
    )

    # --- plans, requests, notices ---------------------------------------------------
    op.add_column("hosting_plan", sa.Column("key", sa.Text))
    op.execute("UPDATE hosting_plan SET key = id::text")
    op.alter_column("hosting_plan", "key", nullable=False)
    op.create_unique_constraint("uq_hosting_plan_org_id_key", "hosting_plan", ["org_id", "key"])
    op.add_column(
        "request",
        sa.Column("simulation", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.add_column(
        "panel_notice",
        sa.Column("severity", sa.Text, nullable=False, server_default=sa.text("'info'")),
    )
    op.add_column(
        "panel_notice",
        sa.Column("email", sa.Text, nullable=False, server_default=sa.text("'off_on_node'")),
    )
    op.add_column("panel_notice", _ts("dismissed_at"))

    op.create_table(
        "notification_preference",
        sa.Column("org_id", sa.Text, primary_key=True),
        sa.Column("recipients", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        _ts("updated_at", "now()", nullable=False),
    )
    op.create_table(
        "email_outbox",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column(
            "notice_id", UUID(as_uuid=True), sa.ForeignKey("panel_notice.id", ondelete="CASCADE")
        ),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("recipients", JSONB, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        _ts("next_attempt_at", "now()", nullable=False),
        sa.Column("lease_owner", sa.Text),
        _ts("lease_expires_at"),
        sa.Column("last_error", sa.Text),
        _ts("created_at", "now()", nullable=False),
        _ts("sent_at"),
        sa.UniqueConstraint("message_id"),
        sa.CheckConstraint("status IN ('pending', 'sent', 'failed')", name="status"),
    )
    op.create_index(
        "ix_email_outbox_due",
        "email_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "platform_event",
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("moment", sa.Text, nullable=False),
        sa.Column("plan_id", sa.Text, nullable=False),
        sa.Column("machine_id", sa.Text, nullable=False),
        _ts("occurred_at"),
        sa.Column("data", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        _ts("received_at", "clock_timestamp()", nullable=False),
        _ts("processed_at"),
        sa.Column("outcome", sa.Text),
        sa.Column("request_id", UUID(as_uuid=True)),
        sa.Column("execution_id", UUID(as_uuid=True)),
        sa.PrimaryKeyConstraint("org_id", "id"),
        sa.CheckConstraint("moment IN ('provisioned', 'reinstalled', 'deleted')", name="moment"),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('STARTED', 'NO_BINDING', 'REJECTED')",
            name="outcome",
        ),
    )
    op.create_index(
        "ix_platform_event_unprocessed",
        "platform_event",
        ["received_at"],
        postgresql_where=sa.text("processed_at IS NULL"),
    )
    grant_runtime("notification_preference", ("SELECT", "INSERT", "UPDATE"))
    grant_runtime("email_outbox", ("SELECT", "INSERT", "UPDATE", "DELETE"))
    grant_runtime("platform_event", ("SELECT", "INSERT", "UPDATE"))


def downgrade() -> None:
    op.drop_table("platform_event")
    op.drop_table("email_outbox")
    op.drop_table("notification_preference")
    op.drop_column("panel_notice", "dismissed_at")
    op.drop_column("panel_notice", "email")
    op.drop_column("panel_notice", "severity")
    op.drop_column("request", "simulation")
    op.drop_constraint("uq_hosting_plan_org_id_key", "hosting_plan", type_="unique")
    op.drop_column("hosting_plan", "key")
    op.drop_index("ix_machine_command_finished", table_name="machine_command")
    for column in ("finished_at", "sent_at", "output", "exit_code", "args"):
        op.drop_column("machine_command", column)
    op.drop_column("action_execution", "observed")
    op.drop_column("action_execution", "first_started_at")
    op.drop_index("ix_execution_wait_key", table_name="execution")
    op.drop_index("ix_execution_due", table_name="execution")
    op.create_index(
        "ix_execution_due",
        "execution",
        ["next_attempt_at", "created_at", "id"],
        postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT')"),
    )
    # A WAITING execution cannot be told apart from one whose retry is due: an older
    # worker claims it as RETRY_WAIT and the step asks again.
    op.execute("UPDATE execution SET status = 'RETRY_WAIT' WHERE status = 'WAITING'")
    op.drop_column("execution", "wait_key")
    op.drop_constraint("status", "execution", type_="check")
    op.create_check_constraint("status", "execution", f"status IN ({_OLD_STATUSES})")
