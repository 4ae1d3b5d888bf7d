"""Machines an operator can see: commands that never arrive late, their output live,
whether their agents are alive, and schedules that run any flow.

Revision ID: 0027
Revises: 0025

Expand only: defaulted and nullable columns, a table, one more allowed value, an index,
grants, and a schedule's flow no longer bound to the `schedule` trigger.

- machine_command.deliver_by: no agent is handed the command after it (the deadline of
  the wait that waits for it, else COMMAND_DELIVERY_SECONDS after it was written). Its
  default, 15 minutes from when a row is written, serves the running release's inserts
  and gives every command written before the upgrade 15 minutes from the upgrade.
- machine_command.status may be `expired`, a final status: never delivered. The partial
  index retention scans covers it like the other final statuses, and a new partial
  index finds the pending commands whose deliver-by time passed.
- machine_command.output_tail, output_received, output_size: an agent sends a running
  command's output in chunks by offset; `output` keeps the head, `output_tail` the
  latest bytes, `output_received` how far the agent's chunks were taken (a chunk sent
  again is taken once) and `output_size` the bytes kept or dropped. A row written whole
  by the running release (size 0, output set) is read as a head of its own length.
- machine_agent: when each machine's agent was last seen (its polls and reports write
  it, at most once per machine per 10 seconds); the runtime role may insert a row and
  update its last_seen_at.
- The runtime role may UPDATE deliver_by (a wait moves it to its own deadline) and the
  three output columns.
- schedule.flow_key and schedule.transition_id: a schedule names any flow, by key (each
  fire starts its latest version) or by version, and the transition each fire accepts.
  The composite key to flow (id, trigger) and the check that bound `flow_trigger` to
  `schedule` give way to a key to flow (id): `flow_trigger` keeps the trigger of the
  version the schedule was put with. The runtime role may UPDATE the three columns. The
  running release reads schedules it put itself as before; one of a new kind that it
  fires (its flow is not a `schedule` flow) fails that schedule's round, set aside for a
  minute, until the workers are rolled.

The downgrade deletes the schedules of flows that are not `schedule` flows (the older
code cannot fire them) before the older key and check come back.

The downgrade reports an `expired` command as `cancelled` (final, never run: the older
code's word for a command no agent will get) before the older check comes back.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0027"
down_revision = "0025"
branch_labels = None
depends_on = None

_FINAL_BEFORE = ("succeeded", "failed", "timed_out", "cancelled")
_FINAL_AFTER = (*_FINAL_BEFORE, "expired")
_COMMAND_UPDATES_BEFORE = (
    "status",
    "exit_code",
    "output",
    "updated_at",
    "sent_at",
    "finished_at",
    "cancel_requested_at",
)
_COMMAND_UPDATES_AFTER = (
    *_COMMAND_UPDATES_BEFORE,
    "deliver_by",
    "output_tail",
    "output_received",
    "output_size",
)


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _command_statuses(final: tuple[str, ...]) -> None:
    op.drop_constraint("status", "machine_command", type_="check")
    op.create_check_constraint(
        "status",
        "machine_command",
        f"status IN ({_listed(('pending', 'sent', 'running', *final))})",
    )
    op.drop_index("ix_machine_command_finished", table_name="machine_command")
    op.create_index(
        "ix_machine_command_finished",
        "machine_command",
        ["finished_at"],
        postgresql_where=sa.text(f"status IN ({_listed(final)})"),
    )


def _updates(table: str, columns: tuple[str, ...]) -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, table, columns)


_SCHEDULE_UPDATES_BEFORE = (
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
_SCHEDULE_UPDATES_AFTER = (*_SCHEDULE_UPDATES_BEFORE, "flow_key", "flow_trigger", "transition_id")


def upgrade() -> None:
    op.add_column(
        "machine_command",
        sa.Column(
            "deliver_by",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("(clock_timestamp() + '00:15:00'::interval)"),
        ),
    )
    op.add_column("machine_command", sa.Column("output_tail", sa.Text()))
    for column in ("output_received", "output_size"):
        op.add_column(
            "machine_command",
            sa.Column(column, sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        )
    _command_statuses(_FINAL_AFTER)
    op.create_index(
        "ix_machine_command_undelivered",
        "machine_command",
        ["deliver_by"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    _updates("machine_command", _COMMAND_UPDATES_AFTER)
    op.create_table(
        "machine_agent",
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("machine_id", sa.Text(), nullable=False),
        sa.Column("last_seen_at", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "machine_id", name=op.f("pk_machine_agent")),
    )
    op.create_index(op.f("ix_machine_agent_last_seen_at"), "machine_agent", ["last_seen_at"])
    grant_runtime("machine_agent", ("SELECT", "INSERT"))
    _updates("machine_agent", ("last_seen_at",))
    op.add_column("schedule", sa.Column("flow_key", sa.Text()))
    op.add_column("schedule", sa.Column("transition_id", sa.Text()))
    op.drop_constraint("flow_trigger", "schedule", type_="check")
    op.drop_constraint("fk_schedule_flow_id_flow_trigger_flow", "schedule", type_="foreignkey")
    op.create_foreign_key(op.f("fk_schedule_flow_id_flow"), "schedule", "flow", ["flow_id"], ["id"])
    _updates("schedule", _SCHEDULE_UPDATES_AFTER)


def downgrade() -> None:
    op.execute(
        sa.text(
            "DELETE FROM schedule s USING flow f WHERE f.id = s.flow_id AND f.trigger <> 'schedule'"
        )
    )
    _updates("schedule", _SCHEDULE_UPDATES_BEFORE)
    op.drop_constraint("fk_schedule_flow_id_flow", "schedule", type_="foreignkey")
    op.execute(sa.text("UPDATE schedule SET flow_trigger = 'schedule'"))
    op.create_foreign_key(
        "fk_schedule_flow_id_flow_trigger_flow",
        "schedule",
        "flow",
        ["flow_id", "flow_trigger"],
        ["id", "trigger"],
    )
    op.create_check_constraint("flow_trigger", "schedule", "flow_trigger = 'schedule'")
    op.drop_column("schedule", "transition_id")
    op.drop_column("schedule", "flow_key")
    op.drop_table("machine_agent")
    _updates("machine_command", _COMMAND_UPDATES_BEFORE)
    op.drop_index("ix_machine_command_undelivered", table_name="machine_command")
    op.execute(sa.text("UPDATE machine_command SET status = 'cancelled' WHERE status = 'expired'"))
    _command_statuses(_FINAL_BEFORE)
    for column in ("output_size", "output_received", "output_tail", "deliver_by"):
        op.drop_column("machine_command", column)
