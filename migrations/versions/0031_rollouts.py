"""Rollouts: one operation across many machines, in batches, with a failure budget.

Revision ID: 0031
Revises: 0030

Expand only: two new tables, one column and one index on execution, one trigger.

- rollout: one row per rollout step (rollout@1), keyed by the step's external key; the
  items frozen when the step first ran, the child flow's version pinned, the batch and
  the failure budget as numbers, and the counts of its children by status.
- rollout_child: one row per started item; its primary key (rollout, item index) makes an
  item start at most one child, whatever crashes or holders there are.
- execution.parent_execution_id: the rollout step's execution that started a child.
- The trigger `execution_rollout_child_ended` counts a child's end in its rollout, under
  the rollout row's lock (the lock a child's start takes to check the budget), and wakes
  the parent waiting on the rollout, in the child's own ending transaction, whatever
  ends it (a finish, a failure, a park, a cancel).

The runtime role may SELECT and INSERT both tables, and UPDATE what a start, an end, a
pause, a resume and a cancel change; never what a rollout runs over.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB, UUID

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

_READY_CHANNEL = "orquestador_execution_ready"
_ROLLOUT_UPDATES = (
    "next_index",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "next_start_at",
    "paused_at",
    "paused_by",
    "cancelled_at",
    "cancelled_by",
    "changed_at",
)

_CHILD_ENDED = f"""
CREATE FUNCTION orquestador_rollout_child_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_rollout uuid;
    v_was text;
    -- A child parked for a person counts as failed: the rollout does not wait for them.
    v_now text := CASE NEW.status WHEN 'SUCCEEDED' THEN 'succeeded'
                                  WHEN 'CANCELLED' THEN 'cancelled'
                                  ELSE 'failed' END;
BEGIN
    SELECT c.rollout_id, c.status INTO v_rollout, v_was
    FROM rollout_child c WHERE c.execution_id = NEW.id;
    IF NOT FOUND OR v_was = v_now THEN
        RETURN NULL;
    END IF;
    -- The rollout row first: a child's start checks the budget under this same lock, so
    -- a start either sees this end or commits before it.
    UPDATE rollout
    SET running = running - (v_was = 'running')::int,
        succeeded = succeeded + (v_now = 'succeeded')::int - (v_was = 'succeeded')::int,
        failed = failed + (v_now = 'failed')::int - (v_was = 'failed')::int,
        cancelled = cancelled + (v_now = 'cancelled')::int - (v_was = 'cancelled')::int,
        changed_at = clock_timestamp()
    WHERE id = v_rollout;
    UPDATE rollout_child SET status = v_now, ended_at = clock_timestamp()
    WHERE rollout_id = v_rollout AND execution_id = NEW.id;
    -- Wake the parent at once, as wake_waiting does for its key (queue/waits.py): a
    -- WAITING parent is due now, a RUNNING round is marked so that its park is.
    UPDATE execution
    SET next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = NEW.parent_execution_id AND status IN ('WAITING', 'RUNNING')
      AND wait_key = 'rollout:' || v_rollout;
    IF FOUND THEN
        PERFORM pg_notify('{_READY_CHANNEL}', '');
    END IF;
    RETURN NULL;
END
$$
"""

_TRIGGER = """
CREATE TRIGGER execution_rollout_child_ended
AFTER UPDATE OF status ON execution
FOR EACH ROW
WHEN (NEW.parent_execution_id IS NOT NULL
      AND NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'RECONCILIATION_REQUIRED')
      AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION orquestador_rollout_child_ended()
"""


def upgrade() -> None:
    op.add_column("execution", sa.Column("parent_execution_id", UUID(as_uuid=True)))
    op.create_index(
        "ix_execution_parent",
        "execution",
        ["parent_execution_id", "created_at"],
        postgresql_where=sa.text("parent_execution_id IS NOT NULL"),
    )
    op.create_table(
        "rollout",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("request_id", UUID(as_uuid=True), nullable=False),
        sa.Column("execution_id", UUID(as_uuid=True), nullable=False),
        sa.Column("action_id", sa.Text, nullable=False),
        sa.Column("external_key", sa.Text, nullable=False),
        sa.Column("flow_id", UUID(as_uuid=True), nullable=False),
        sa.Column("transition_id", sa.Text, nullable=False),
        sa.Column("items", JSONB, nullable=False),
        sa.Column("data", JSONB, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("max_failures", sa.Integer, nullable=False),
        sa.Column("pause_between_seconds", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("actor_snapshot", JSONB, nullable=False),
        sa.Column("priority", sa.SmallInteger, nullable=False),
        sa.Column("retry_of", UUID(as_uuid=True)),
        sa.Column("next_index", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("running", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("succeeded", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("failed", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("cancelled", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("next_start_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("paused_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("paused_by", sa.Text),
        sa.Column("cancelled_at", sa.TIMESTAMP(timezone=True)),
        sa.Column("cancelled_by", sa.Text),
        sa.Column("changed_at", sa.TIMESTAMP(timezone=True)),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.UniqueConstraint("external_key", name="uq_rollout_external_key"),
        sa.CheckConstraint(
            "batch >= 1 AND max_failures >= 0 AND total >= 0", name="ck_rollout_limits"
        ),
        sa.CheckConstraint("next_index BETWEEN 0 AND total", name="ck_rollout_next_index"),
        sa.CheckConstraint(
            "running >= 0 AND succeeded >= 0 AND failed >= 0 AND cancelled >= 0",
            name="ck_rollout_counts",
        ),
    )
    op.create_index("ix_rollout_execution_id", "rollout", ["execution_id"])
    op.create_table(
        "rollout_child",
        sa.Column(
            "rollout_id",
            UUID(as_uuid=True),
            sa.ForeignKey("rollout.id", name="fk_rollout_child_rollout_id_rollout"),
            nullable=False,
        ),
        sa.Column("item_index", sa.Integer, nullable=False),
        sa.Column("parent_execution_id", UUID(as_uuid=True), nullable=False),
        sa.Column("item", JSONB, nullable=False),
        sa.Column("request_id", UUID(as_uuid=True)),
        sa.Column("execution_id", UUID(as_uuid=True)),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'running'")),
        sa.Column("refusal", sa.Text),
        sa.Column(
            "created_at",
            sa.TIMESTAMP(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("ended_at", sa.TIMESTAMP(timezone=True)),
        sa.PrimaryKeyConstraint("rollout_id", "item_index", name="pk_rollout_child"),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'cancelled')",
            name="ck_rollout_child_status",
        ),
    )
    op.create_index("ux_rollout_child_execution", "rollout_child", ["execution_id"], unique=True)
    grant_runtime("rollout", ("SELECT", "INSERT"))
    grant_runtime("rollout_child", ("SELECT", "INSERT"))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "rollout", _ROLLOUT_UPDATES)
        restrict_updates(op.get_bind(), role, "rollout_child", ("status", "ended_at"))
    op.execute(text(_CHILD_ENDED))
    op.execute(text(_TRIGGER))
    schema = op.get_bind().execute(text("SELECT current_schema()")).scalar_one()
    function = "orquestador_rollout_child_ended()"
    op.execute(
        text(f"ALTER FUNCTION {schema}.{function} SET search_path = pg_catalog, {schema}, pg_temp")
    )
    op.execute(text(f"REVOKE ALL ON FUNCTION {schema}.{function} FROM PUBLIC"))


def downgrade() -> None:
    op.execute(text("DROP TRIGGER execution_rollout_child_ended ON execution"))
    op.execute(text("DROP FUNCTION orquestador_rollout_child_ended()"))
    op.drop_table("rollout_child")
    op.drop_table("rollout")
    op.drop_index("ix_execution_parent", table_name="execution")
    op.drop_column("execution", "parent_execution_id")
