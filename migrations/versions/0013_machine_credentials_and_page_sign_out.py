"""Revocable machine credentials and server-side page sign-out.

Revision ID: 0013
Revises: 0012

Expand only: two new, empty tables; nothing existing changes.

- machine_credential: an enrolled agent token's id (its `jti`, never the token), the
  machine and organization it was issued for, when and by whom, when it expires, and
  when and by whom it was revoked. Operators enrol as the owner role
  (`orquestador machines enroll`); the runtime role reads the table (the API checks
  every agent request against it) and may UPDATE `revoked_at` and `revoked_by` only.
- page_session_revocation: the SHA-256 of a token signed out of the pages, until the
  token expires; the runtime role inserts one at sign-out, reads them on every page and
  deletes those past their expiry.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _ts(name: str, *, nullable: bool = True, default: str | None = None) -> sa.Column:
    return sa.Column(
        name,
        sa.TIMESTAMP(timezone=True),
        nullable=nullable,
        server_default=sa.text(default) if default else None,
    )


def upgrade() -> None:
    op.create_table(
        "machine_credential",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("machine_id", sa.Text, nullable=False),
        _ts("issued_at", nullable=False),
        _ts("expires_at", nullable=False),
        sa.Column("issued_by", sa.Text, nullable=False),
        _ts("revoked_at"),
        sa.Column("revoked_by", sa.Text),
        sa.CheckConstraint("expires_at > issued_at", name="lifetime"),
        sa.CheckConstraint("(revoked_at IS NULL) = (revoked_by IS NULL)", name="revoked_by_whom"),
    )
    op.create_index(
        "ix_machine_credential_org_id_machine_id",
        "machine_credential",
        ["org_id", "machine_id"],
    )
    op.create_table(
        "page_session_revocation",
        sa.Column("token_sha256", sa.Text, primary_key=True),
        sa.Column("org_id", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        _ts("expires_at", nullable=False),
        _ts("revoked_at", nullable=False, default="clock_timestamp()"),
    )
    op.create_index(
        "ix_page_session_revocation_expires_at", "page_session_revocation", ["expires_at"]
    )
    grant_runtime("machine_credential", ("SELECT",))
    grant_runtime("page_session_revocation", ("SELECT", "INSERT", "DELETE"))
    role = runtime_role()
    if role is not None:
        # Revoking only: a credential's machine, organization and expiry stay the owner's.
        restrict_updates(op.get_bind(), role, "machine_credential", ("revoked_at", "revoked_by"))


def downgrade() -> None:
    op.drop_table("page_session_revocation")
    op.drop_table("machine_credential")
