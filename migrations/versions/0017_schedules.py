"""Schedules: flows started at fire times (a five-field cron in a time zone, or every N seconds).

Revision ID: 0017
Revises: 0016

Expand only: a trigger value, two tables.

- flow.trigger may be `schedule`: such a flow names its `start` transition, like a
  moment-triggered one.
- schedule(org_id, id, flow_id, cron | every_seconds, timezone, data, catch_up, paused,
  next_fire_at, last_fired_at, missed, retry_at, ...): the caller's id per organization. Its flow
  is named with the flow's trigger (`flow_trigger`, always `schedule`) in a composite
  key to flow (id, trigger), so the schema refuses a flow of any other trigger.
  `ix_schedule_due` holds the schedules a worker may fire, soonest first.
- schedule_fire(org_id, schedule_id, fire_time, request_id, execution_id, fired_at):
  one row per fire time handled; its primary key is what makes a fire time start one
  execution at most, whatever the number of workers. `ix_schedule_fire_fired_at` serves
  its retention (SCHEDULE_FIRE_RETENTION_DAYS).

The runtime role may SELECT, INSERT and DELETE schedule and UPDATE what PUT /schedules
and the firing loop write (never its organization, id or `flow_trigger`); it may SELECT,
INSERT and DELETE (retention) schedule_fire and UPDATE only the request and execution a
fire started.

Downgrade drops both tables and turns the flows published with trigger `schedule` into
`manual` ones (the older code knows no schedule; their requests and executions stay).
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

# The columns the runtime role may UPDATE as of this revision (later ones add to them):
# written out, so this migration grants the same whatever the schema says today.
SCHEDULE_UPDATE_COLUMNS = (
    "flow_id",
    "cron",
    "every_seconds",
    "timezone",
    "data",
    "catch_up",
    "paused",
    "next_fire_at",
    "last_fired_at",
    "missed",
    "retry_at",
    "updated_by",
    "updated_at",
)

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_TRIGGERS_BEFORE = "trigger IN ('manual', 'webhook', 'provisioned', 'reinstalled', 'deleted')"
_TRIGGERS_AFTER = (
    "trigger IN ('manual', 'webhook', 'provisioned', 'reinstalled', 'deleted', 'schedule')"
)


def upgrade() -> None:
    op.drop_constraint("trigger", "flow", type_="check")
    op.create_check_constraint("trigger", "flow", _TRIGGERS_AFTER)
    op.create_table(
        "schedule",
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("flow_id", UUID(as_uuid=True), nullable=False),
        sa.Column("flow_trigger", sa.Text(), nullable=False, server_default=sa.text("'schedule'")),
        sa.Column("cron", sa.Text()),
        sa.Column("every_seconds", sa.Integer()),
        sa.Column("timezone", sa.Text(), nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("data", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("catch_up", sa.Text(), nullable=False, server_default=sa.text("'skip'")),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("next_fire_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("last_fired_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("missed", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("retry_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column(
            "updated_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("org_id", "id"),
        sa.ForeignKeyConstraint(["flow_id", "flow_trigger"], ["flow.id", "flow.trigger"]),
        sa.CheckConstraint("flow_trigger = 'schedule'", name="flow_trigger"),
        sa.CheckConstraint("num_nonnulls(cron, every_seconds) = 1", name="cron_or_every"),
        sa.CheckConstraint("every_seconds >= 1", name="every_seconds_positive"),
        sa.CheckConstraint("catch_up IN ('skip', 'one', 'all')", name="catch_up"),
        sa.CheckConstraint("missed >= 0", name="missed_not_negative"),
    )
    op.create_index(
        "ix_schedule_due",
        "schedule",
        ["next_fire_at"],
        postgresql_where=sa.text("NOT paused AND next_fire_at IS NOT NULL"),
    )
    op.create_table(
        "schedule_fire",
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("schedule_id", sa.Text(), nullable=False),
        sa.Column("fire_time", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("request_id", UUID(as_uuid=True)),
        sa.Column("execution_id", UUID(as_uuid=True)),
        sa.Column(
            "fired_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("clock_timestamp()"),
        ),
        sa.PrimaryKeyConstraint("org_id", "schedule_id", "fire_time"),
        sa.ForeignKeyConstraint(
            ["org_id", "schedule_id"],
            ["schedule.org_id", "schedule.id"],
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_schedule_fire_fired_at", "schedule_fire", ["fired_at"])
    grant_runtime("schedule", ("SELECT", "INSERT", "DELETE"))
    grant_runtime("schedule_fire", ("SELECT", "INSERT", "DELETE"))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "schedule", SCHEDULE_UPDATE_COLUMNS)
        restrict_updates(op.get_bind(), role, "schedule_fire", ("request_id", "execution_id"))


def downgrade() -> None:
    op.drop_table("schedule_fire")
    op.drop_table("schedule")
    op.execute(sa.text("UPDATE flow SET trigger = 'manual' WHERE trigger = 'schedule'"))
    op.drop_constraint("trigger", "flow", type_="check")
    op.create_check_constraint("trigger", "flow", _TRIGGERS_BEFORE)
