"""Retry with a correction: the runtime role may move an execution's accepted revision.

Revision ID: 0023
Revises: 0022

Grants only: no table or column changes.

An operator's retry may correct the request data it holds (queue/reconciliation.py).
The correction is a change of the request like any other, so it takes a new revision;
the execution's accepted revision moves with it in the same statement, so the retried
step reads the corrected data as the request it holds, and the check that nothing else
changed the request (at load and in the finish) still holds. The runtime role may now
UPDATE execution.accepted_revision; the downgrade takes that back.
"""

from alembic import op

from orquestador.db.grants import restrict_updates, runtime_role

revision = "0023"
down_revision = "0022"
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
)
_UPDATES_AFTER = (*_UPDATES_BEFORE, "accepted_revision")


def upgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_AFTER)


def downgrade() -> None:
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "execution", _UPDATES_BEFORE)
