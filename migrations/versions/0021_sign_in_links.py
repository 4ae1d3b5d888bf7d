"""Sign-in links: a hosting panel hands its user over to the pages with a one-time link.

Revision ID: 0021
Revises: 0020

Expand only: one new table.

- sign_in_link: the SHA-256 of a link's secret (never the secret), whom it signs in
  (organization, subject, scopes), where to, until when, and when it was used. Using a
  link is one conditional update of an unused, unexpired row: a second use finds it used.

The runtime role may SELECT, INSERT and DELETE (expired links) sign_in_link and UPDATE
only `used_at`.
"""

import sqlalchemy as sa
from alembic import op

from orquestador.db.grants import grant_runtime, restrict_updates, runtime_role

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sign_in_link",
        sa.Column("secret_sha256", sa.Text(), primary_key=True),
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("next_page", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("used_at", sa.TIMESTAMP(timezone=True)),
    )
    op.create_index("ix_sign_in_link_expires_at", "sign_in_link", ["expires_at"])
    grant_runtime("sign_in_link", ("SELECT", "INSERT", "DELETE"))
    role = runtime_role()
    if role is not None:
        restrict_updates(op.get_bind(), role, "sign_in_link", ("used_at",))


def downgrade() -> None:
    op.drop_table("sign_in_link")
