"""Runs the alembic migrations programmatically, on a URL or on a connection handed in."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, pool
from sqlalchemy.engine import make_url

from orquestador.config import sqlalchemy_url


def migrations_path() -> Path:
    """The alembic tree: the top-level migrations/ of a checkout, or the installed package."""
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    return Path(str(resources.files("orquestador.migrations")))


def alembic_config(
    *, url: str | None = None, connection: Connection | None = None, runtime_role: str | None
) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    config.attributes["runtime_role"] = runtime_role
    if connection is not None:
        config.attributes["connection"] = connection
    elif url is not None:
        config.attributes["url"] = sqlalchemy_url(url)
    return config


def runtime_role_for(database_url: str, configured_role: str = "") -> str | None:
    """The role the runtime connects as: RUNTIME_DATABASE_ROLE, else DATABASE_URL's user."""
    if configured_role:
        return configured_role
    if database_url:
        return make_url(database_url).username
    return None


def upgrade(config: Config, revision: str = "head") -> None:
    command.upgrade(config, revision)


def downgrade(config: Config, revision: str) -> None:
    command.downgrade(config, revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config(runtime_role=None))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(url: str) -> str | None:
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
