"""Cancel reaches the machine: a `cancelled` command status and `cancel_requested_at`.

Revision ID: 0014
Revises: 0013

Expand only: one new nullable column and one more allowed value.

- machine_command.status may be `cancelled`, a final status: a cancel ends the
  execution's commands that no agent has taken yet, and an agent reports it for one it
  stopped. The partial index retention scans covers it like the other final statuses.
- machine_command.cancel_requested_at: when a cancel asked the agent to stop a command
  it had already taken (sent or running). The runtime role may UPDATE it, beside the
  columns it already could.

The downgrade reports a `cancelled` command as `failed` (the status the older code
knows that is final and not a success) before the older check comes back.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import restrict_updates, runtime_role

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_BEFORE = ("succeeded", "failed", "timed_out")
_AFTER = (*_BEFORE, "cancelled")
_UPDATES_BEFORE = ("status", "exit_code", "output", "updated_at", "sent_at", "finished_at")
_UPDATES_AFTER = (*_UPDATES_BEFORE, "cancel_requested_at")


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _statuses(final: tuple[str, ...]) -> None:
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


def _updates(columns: tuple[str, ...]) -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "machine_command", columns)


def upgrade() -> None:
    op.add_column("machine_command", sa.Column("cancel_requested_at", sa.TIMESTAMP(timezone=True)))
    _statuses(_AFTER)
    _updates(_UPDATES_AFTER)


def downgrade() -> None:
    op.execute(sa.text("UPDATE machine_command SET status = 'failed' WHERE status = 'cancelled'"))
    _updates(_UPDATES_BEFORE)
    _statuses(_BEFORE)
    op.drop_column("machine_command", "cancel_requested_at")
