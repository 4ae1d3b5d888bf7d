"""The local database of `orquestador dev`: an embedded server with an owner and a runtime role."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, pool, text

from orquestador.config import sqlalchemy_url
from orquestador.db.embedded import (
    EmbeddedPostgres,
    check_private_dir,
    first_unreachable,
    server_account,
)

log = logging.getLogger(__name__)

DATABASE_NAME = "orquestador"
OWNER_ROLE = "postgres"
RUNTIME_ROLE = "orquestador_runtime"


@dataclass(frozen=True)
class LocalDatabase:
    """URLs of the embedded server: the owner migrates, the runtime role does the rest."""

    server: EmbeddedPostgres
    migration_url: str
    runtime_url: str
    runtime_role: str = RUNTIME_ROLE


def data_dir_for(home: Path) -> Path:
    """HOME/pgdata, unless the server's account cannot reach HOME.

    Under root the server runs as an unprivileged account; a project folder only root may
    enter (under /root, say) is out of its reach. The data then lives in a folder of that
    account under /var/tmp (kept across reboots), one per HOME so it persists between runs.
    """
    home = home.resolve()
    account = server_account()
    if account is None or first_unreachable(home, account) is None:
        return home / "pgdata"
    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    folder = _persistent_temp_dir() / f"orquestador-dev-{digest}"
    try:
        folder.mkdir(mode=0o700)
        os.chown(folder, *account)
    except FileExistsError:
        pass
    check_private_dir(folder, account[0])
    return folder / "pgdata"


def _persistent_temp_dir() -> Path:
    # /var/tmp survives reboots where /tmp often does not; both are sticky and world-writable.
    var_tmp = Path("/var/tmp")
    try:
        mode = var_tmp.stat().st_mode
    except OSError:
        mode = 0
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        return var_tmp
    return Path(tempfile.gettempdir())


def start_local_database(home: Path) -> LocalDatabase:
    """Start (or reuse) the server on data_dir_for(HOME); make sure the database and roles exist."""
    home.mkdir(parents=True, exist_ok=True)
    server = EmbeddedPostgres(data_dir_for(home), superuser=OWNER_ROLE)
    server.start()
    admin = create_engine(
        sqlalchemy_url(server.url("postgres", user=OWNER_ROLE)),
        poolclass=pool.NullPool,
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as connection:
            if not connection.execute(
                text("SELECT 1 FROM pg_roles WHERE rolname = :role"), {"role": RUNTIME_ROLE}
            ).first():
                # Unix socket only, trust auth: the runtime role needs no password here.
                connection.execute(text(f"CREATE ROLE {RUNTIME_ROLE} LOGIN"))
            if not connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": DATABASE_NAME}
            ).first():
                connection.execute(text(f"CREATE DATABASE {DATABASE_NAME} OWNER {OWNER_ROLE}"))
    finally:
        admin.dispose()
    return LocalDatabase(
        server=server,
        migration_url=plain_url(server.url(DATABASE_NAME, user=OWNER_ROLE)),
        runtime_url=plain_url(server.url(DATABASE_NAME, user=RUNTIME_ROLE)),
    )


def plain_url(url: str) -> str:
    """The form a person pastes into DATABASE_URL (any postgresql:// driver suffix dropped)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
