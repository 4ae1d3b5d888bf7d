"""Cancel reaches running work: a cancel asked of a RUNNING execution is recorded.

Revision ID: 0034
Revises: 0033

Expand only: three nullable columns on execution, and the batch writer refusing to go
on past a requested cancel.

- execution.cancel_requested_at, cancel_requested_by, cancel_requested_reason: when,
  by whom and why a person asked to cancel the execution while a step's call was in
  flight (or a wait was being checked again). The call is never cut: its holder
  applies the cancel, by the write rule, once the call has returned. An operator's
  retry of a parked execution clears them. The runtime role may UPDATE them.
- orquestador_write_batch (same signature): a RUNNING checkpoint or a finish of an
  execution with a cancel requested is not written (a riding SUCCEEDED still is) and
  is answered `cancelRequested`: the job applies the cancel under its fence instead
  of calling the next step or finishing. The cancel's lock on the execution row and
  the batch's serialize, so no step starts after a cancel request committed.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import restrict_updates, runtime_role

revision = "0034"
down_revision = "0033"
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
    "key_blocked",
    "accepted_revision",
    "continuations",
)
_COLUMNS = ("cancel_requested_at", "cancel_requested_by", "cancel_requested_reason")
_UPDATES_AFTER = (*_UPDATES_BEFORE, *_COLUMNS)

# Rows whose execution a person asked to cancel: read among the rows the batch locked.
_CANCEL_READ = """
    -- 2b. Executions a person asked to cancel while they ran: their RUNNING and finish
    --     rows are not written (a riding SUCCEEDED is, in step 3); the job applies the
    --     cancel under its fence instead. The row is locked above, so a cancel request
    --     committed before this batch is seen, and one after it waits for COMMIT.
    SELECT coalesce(jsonb_agg(jsonb_build_array(e.id, e.fencing_token)), '[]'),
           coalesce(array_agg(e.id), '{}')
    INTO v_cancel_requested, v_cancel
    FROM execution e
    WHERE e.id = ANY (v_held) AND e.cancel_requested_at IS NOT NULL;
"""

_NOT_CANCELLED = " AND NOT (i.execution_id = ANY (v_cancel))"


def _migration(name: str) -> ModuleType:
    # A migration file is not an importable module name.
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _once(body: str, old: str, new: str) -> str:
    assert body.count(old) == 1, f"expected one {old!r} in the batch function"
    return body.replace(old, new)


def _body(previous: ModuleType) -> str:
    """0011's body with the cancel request read and honoured (see the docstring)."""
    body: str = previous._BODY
    held, rider = previous._HELD, previous._RIDER_WRITTEN
    body = _once(
        body,
        "    v_done_tokens bigint[] := '{}';\n",
        "    v_done_tokens bigint[] := '{}';\n"
        "    v_cancel uuid[] := '{}';        -- executions with a cancel requested\n"
        "    v_cancel_requested jsonb := '[]';\n",
    )
    body = _once(
        body,
        "    INTO v_locked, v_held, v_tokens, v_leases\n    FROM locked l;\n",
        "    INTO v_locked, v_held, v_tokens, v_leases\n    FROM locked l;\n" + _CANCEL_READ,
    )
    start_holder = f"SELECT i.* FROM input i {held} WHERE {rider}"
    body = _once(body, start_holder, start_holder + _NOT_CANCELLED)
    finish_holder = f"WHERE e.id = ANY (v_held) AND {rider}"
    body = _once(body, finish_holder, finish_holder + _NOT_CANCELLED)
    return _once(
        body,
        "'finished', v_finished);",
        "'finished', v_finished,\n"
        "                              'cancelRequested', v_cancel_requested);",
    )


def upgrade() -> None:
    for column in _COLUMNS:
        kind = sa.TIMESTAMP(timezone=True) if column.endswith("_at") else sa.Text()
        op.add_column("execution", sa.Column(column, kind))
    previous = _migration("0011_write_batch_rows.py")
    previous._replace(_body(previous))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_AFTER)


def downgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_BEFORE)
    previous = _migration("0011_write_batch_rows.py")
    previous._replace(previous._BODY)
    for column in reversed(_COLUMNS):
        op.drop_column("execution", column)
