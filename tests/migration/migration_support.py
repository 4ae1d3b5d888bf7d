"""What the migration tests share: moving a scratch database to a revision."""

from __future__ import annotations

from orquestador.db import migrate
from tests.db_support import RUNTIME_ROLE, TestServer


def step(server: TestServer, name: str, revision: str, *, down: bool = False) -> None:
    """Upgrade (or, `down`, downgrade) database `name` to `revision`, granting as it goes."""
    config = migrate.alembic_config(
        url=server.url(name).render_as_string(hide_password=False), runtime_role=RUNTIME_ROLE
    )
    (migrate.downgrade if down else migrate.upgrade)(config, revision)
