"""Concurrency keys, priorities and fair claims.

Revision ID: 0015
Revises: 0014

Expand only: new columns with defaults, new indexes, a trigger and a function.

- execution.priority (0-9, default 5): within an organization the claim takes higher
  priorities first, oldest due first within a priority.
- execution.concurrency_key / concurrency_limit: the value a transition's
  `concurrency.key` pointer read at acceptance, and the limit it declared. An execution
  holds its key from its first claim (started_at is set) until it ends: holding is read
  from the row itself (`ix_execution_key_holders`), so nothing can leave a key held by
  an execution that has ended.
- execution.key_blocked: a PENDING execution the claim found its key full for. It
  leaves the claim's index, so a long line behind one key costs the claim nothing.
- ix_execution_due leaves key_blocked executions out too: the gauge of the oldest due
  execution counts work a worker could take, not a line waiting for its key.
- ix_execution_ready: the claim's index, one organization at a time (fairness), one
  priority at a time, oldest due first.
- key_release: a key a holder let go of, written by the trigger
  `execution_key_released` in the holder's ending transaction (whatever ends it: the
  worker, a cancel, a reconciliation).
- orquestador_key_room(orgs, keys, limits, wants): called by the claim with the keys its
  first claims want and the keys released since. Under each key's transaction-scoped
  advisory lock, taken in one global order, it counts the key's holders afresh (a claim
  that waited for the lock sees what the claim before it committed), answers the room
  left, and lets the oldest blocked executions of a released key back, as many as the
  room this claim's own candidates leave. Blocking and waking both happen under the
  key's lock, so no wake is lost between them.

The runtime role may UPDATE key_blocked, and SELECT, INSERT and DELETE key_release (with
UPDATE of its identity column only, for FOR UPDATE SKIP LOCKED); the
functions are executable by the runtime role only, like the other product functions.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role
from orquestador.db.schema import (
    EXECUTION_READY_CHANNEL,
    KEY_LOCK_CLASS,
    KEY_ROOM_FUNCTION,
    KEY_ROOM_SIGNATURE,
)

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_UPDATES_BEFORE = (
    "status",
    "attempts",
    "max_attempts",
    "fencing_token",
    "lease_owner",
    "lease_expires_at",
    "next_attempt_at",
    "result",
    "error_code",
    "error_detail",
    "wait_key",
    "started_at",
    "updated_at",
    "finished_at",
)
_UPDATES_AFTER = (*_UPDATES_BEFORE, "key_blocked")

_HOLDING = "('PENDING', 'RUNNING', 'RETRY_WAIT', 'WAITING', 'RECONCILIATION_REQUIRED')"
_ENDED = "('SUCCEEDED', 'FAILED', 'CANCELLED')"
KEY_HOLDING_H = f"h.started_at IS NOT NULL AND h.status IN {_HOLDING}"

_KEY_ROOM = f"""
CREATE FUNCTION {KEY_ROOM_FUNCTION}(
    p_orgs text[], p_keys text[], p_limits integer[], p_wants integer[]
)
RETURNS TABLE (org_id text, concurrency_key text, room integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v record;
    v_held integer;
    v_limit integer;
BEGIN
    -- One lock per key, taken in the order of the lock ids: two claims that want the
    -- same keys queue on them in the same order and never wait on each other in a
    -- cycle (two keys that share a lock id share its queue, nothing worse). Nothing but
    -- claims takes these locks.
    FOR v IN
        SELECT k.org_id, k.concurrency_key, k.lim, k.want,
               hashtext(k.org_id || '/' || k.concurrency_key) AS lock_id
        FROM unnest(p_orgs, p_keys, p_limits, p_wants) AS k(org_id, concurrency_key, lim, want)
        ORDER BY lock_id, k.org_id, k.concurrency_key
    LOOP
        PERFORM pg_advisory_xact_lock({KEY_LOCK_CLASS}, v.lock_id);
        -- Statements of their own, so fresh snapshots: they see what a claim that held
        -- this lock before committed (its holders, the executions it blocked).
        SELECT count(*) INTO v_held
        FROM execution h
        WHERE h.org_id = v.org_id AND h.concurrency_key = v.concurrency_key
          AND {KEY_HOLDING_H};
        org_id := v.org_id;
        concurrency_key := v.concurrency_key;
        room := greatest(coalesce(v.lim, 0) - v_held, 0);
        -- A key a holder let go of: the oldest executions blocked on it come back to the
        -- claim, as many as the room this claim's own candidates leave.
        SELECT b.concurrency_limit INTO v_limit
        FROM execution b
        WHERE b.org_id = v.org_id AND b.concurrency_key = v.concurrency_key
          AND b.key_blocked AND b.status = 'PENDING'
        ORDER BY b.priority DESC, b.created_at, b.id
        LIMIT 1;
        IF v_limit IS NOT NULL
           AND v_limit - v_held - least(greatest(coalesce(v.lim, 0) - v_held, 0), v.want) > 0
        THEN
            UPDATE execution SET key_blocked = false
            WHERE id = ANY (ARRAY(
                SELECT b.id
                FROM execution b
                WHERE b.org_id = v.org_id AND b.concurrency_key = v.concurrency_key
                  AND b.key_blocked AND b.status = 'PENDING'
                ORDER BY b.priority DESC, b.created_at, b.id
                LIMIT v_limit - v_held - least(greatest(coalesce(v.lim, 0) - v_held, 0), v.want)
            ));
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$
"""

_KEY_RELEASED = f"""
CREATE FUNCTION orquestador_key_released() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- In the holder's ending transaction: the next claim takes the row and lets the
    -- executions blocked on the key back, under the key's lock (see the function above).
    -- Done here, without that lock, a claim deciding on the key at this moment could
    -- block an execution after this transaction looked, and nobody would wake it.
    INSERT INTO key_release (org_id, concurrency_key) VALUES (OLD.org_id, OLD.concurrency_key);
    PERFORM pg_notify('{EXECUTION_READY_CHANNEL}', '');
    RETURN NULL;
END
$$
"""

_TRIGGER = f"""
CREATE TRIGGER execution_key_released
AFTER UPDATE OF status ON execution
FOR EACH ROW
WHEN (OLD.concurrency_key IS NOT NULL AND OLD.started_at IS NOT NULL
      AND NEW.status IN {_ENDED} AND OLD.status NOT IN {_ENDED})
EXECUTE FUNCTION orquestador_key_released()
"""


def _schema() -> str:
    return op.get_bind().execute(text("SELECT current_schema()")).scalar_one()


def _due_index(where: str) -> None:
    op.drop_index("ix_execution_due", table_name="execution")
    op.create_index(
        "ix_execution_due",
        "execution",
        ["next_attempt_at", "created_at", "id"],
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    op.add_column(
        "execution",
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default=sa.text("5")),
    )
    op.add_column("execution", sa.Column("concurrency_key", sa.Text()))
    op.add_column("execution", sa.Column("concurrency_limit", sa.Integer()))
    op.add_column(
        "execution",
        sa.Column("key_blocked", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.create_check_constraint("priority", "execution", "priority BETWEEN 0 AND 9")
    op.create_check_constraint(
        "concurrency",
        "execution",
        "(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit >= 1",
    )
    _due_index("status IN ('PENDING', 'RETRY_WAIT', 'WAITING') AND NOT key_blocked")
    op.create_index(
        "ix_execution_ready",
        "execution",
        ["org_id", "priority", "next_attempt_at", "id"],
        postgresql_where=sa.text(
            "status IN ('PENDING', 'RETRY_WAIT', 'WAITING') AND NOT key_blocked"
        ),
    )
    op.create_index(
        "ix_execution_key_holders",
        "execution",
        ["org_id", "concurrency_key"],
        postgresql_where=sa.text(
            f"concurrency_key IS NOT NULL AND started_at IS NOT NULL AND status IN {_HOLDING}"
        ),
    )
    op.create_index(
        "ix_execution_key_blocked",
        "execution",
        ["org_id", "concurrency_key", "priority", "created_at", "id"],
        postgresql_where=sa.text("key_blocked AND status = 'PENDING'"),
    )
    op.create_table(
        "key_release",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), primary_key=True),
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("concurrency_key", sa.Text(), nullable=False),
    )
    grant_runtime("key_release", ("SELECT", "INSERT", "DELETE"))
    role = runtime_role()
    if role is not None:
        # A claim locks release rows FOR UPDATE SKIP LOCKED, which needs UPDATE on one
        # column: the identity column, which cannot be set to anything but its default.
        restrict_updates(op.get_bind(), role, "key_release", ("id",))
    op.execute(text(_KEY_ROOM))
    op.execute(text(_KEY_RELEASED))
    op.execute(text(_TRIGGER))
    schema = _schema()
    for function in (KEY_ROOM_SIGNATURE, "orquestador_key_released()"):
        op.execute(
            text(
                f"ALTER FUNCTION {schema}.{function}"
                f" SET search_path = pg_catalog, {schema}, pg_temp"
            )
        )
    for function in (KEY_ROOM_SIGNATURE, "orquestador_key_released()"):
        op.execute(text(f"REVOKE ALL ON FUNCTION {schema}.{function} FROM PUBLIC"))
    role = runtime_role()
    if role is not None:
        quoted = op.get_bind().dialect.identifier_preparer.quote(role)
        op.execute(text(f"GRANT EXECUTE ON FUNCTION {schema}.{KEY_ROOM_SIGNATURE} TO {quoted}"))
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_AFTER)


def downgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_BEFORE)
    op.execute(text("DROP TRIGGER execution_key_released ON execution"))
    op.execute(text("DROP FUNCTION orquestador_key_released()"))
    op.execute(text(f"DROP FUNCTION {KEY_ROOM_SIGNATURE}"))
    op.drop_table("key_release")
    op.drop_index("ix_execution_key_blocked", table_name="execution")
    op.drop_index("ix_execution_key_holders", table_name="execution")
    op.drop_index("ix_execution_ready", table_name="execution")
    _due_index("status IN ('PENDING', 'RETRY_WAIT', 'WAITING')")
    op.drop_constraint("concurrency", "execution", type_="check")
    op.drop_constraint("priority", "execution", type_="check")
    for column in ("key_blocked", "concurrency_limit", "concurrency_key", "priority"):
        op.drop_column("execution", column)
