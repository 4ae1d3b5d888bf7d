"""request keeps a tenth of each page free, so that its updates stay on the page (HOT).

Revision ID: 0035
Revises: 0034

Expand only: a storage parameter, no rewrite. A request is written once and updated at
each acceptance (its busy execution) and each finish (state, revision, data), often
long after its page filled with later requests. On a full page the new version goes to
another page and every index of request gets a new entry; with room on the page the
update is HOT: no index entry, less WAL. Measured with benchmarks/wal_profile.py on
request pages full of earlier rows: 90 % of the finishes' updates HOT at the default
fillfactor, 99.5 % at 90 (docs/PERFORMANCE.md, "Round three: WAL and row versions").
The parameter shapes pages as they are written: pages already full stay so until
VACUUM FULL (or a copy) rewrites the table, which this migration does not do, to take
no lock beyond the ALTER's brief one.
"""

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE request SET (fillfactor = 90)")


def downgrade() -> None:
    op.execute("ALTER TABLE request RESET (fillfactor)")
