"""Runs the alembic migrations programmatically, on a URL or on a connection handed in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, pool, text
from sqlalchemy.exc import SQLAlchemyError

from orquestador.config import Settings, sqlalchemy_url
from orquestador.db.bounds import FunctionBounds, apply_function_bounds
from orquestador.db.grants import (
    PlatformRoleIsRuntimeRole,
    apply_platform_grants,
    apply_runtime_grants,
    revoke_temporary,
)
from orquestador.errors import OrquestadorError


class MigrationFailed(OrquestadorError):
    """The migration failed; nothing of it was applied."""

    code = "MIGRATION_FAILED"


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
        return sqlalchemy_url(database_url).username
    return None


def upgrade(config: Config, revision: str = "head") -> None:
    with _one_line_errors():
        command.upgrade(config, revision)


def downgrade(config: Config, revision: str) -> None:
    with _one_line_errors():
        command.downgrade(config, revision)


@contextmanager
def _one_line_errors(failure: str = "migration failed") -> Iterator[None]:
    # The whole run is one transaction, so a failure leaves the schema as it was;
    # the operator needs the database's reason, not a traceback.
    try:
        yield
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()
        raise MigrationFailed(f"{failure}: {reason[0] if reason else error}") from error


def current_revision(url: str) -> str | None:
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """The newest revision this code knows."""
    config = alembic_config(runtime_role=None)
    return ScriptDirectory.from_config(config).get_current_head()


def role_exists(url: str, role: str) -> bool:
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with _one_line_errors(), engine.connect() as connection:
            found = connection.execute(
                text("SELECT 1 FROM pg_roles WHERE rolname = :role"), {"role": role}
            ).first()
            return found is not None
    finally:
        engine.dispose()


def grant_runtime_role(
    url: str,
    role: str,
    platform_role: str | None = None,
    bounds: FunctionBounds | None = None,
) -> list[str]:
    """Re-apply every runtime grant to ROLE in one transaction; return the tables granted.

    The platform role (`platform_role`, else PLATFORM_DATABASE_ROLE; none when empty) is
    left with INSERT on platform_event and nothing else, in the same transaction; PUBLIC
    and ROLE lose TEMPORARY on the database (grants.revoke_temporary). The functions'
    bounds are written too (`bounds`, else from the retention settings of
    this environment, the owner's), once the database has their table.
    """
    if platform_role is None or bounds is None:
        settings = Settings.from_env()
        platform_role = settings.platform_database_role if platform_role is None else platform_role
        bounds = FunctionBounds.from_settings(settings) if bounds is None else bounds
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with _one_line_errors("grant failed"), engine.begin() as connection:
            tables = apply_runtime_grants(connection, role)
            revoke_temporary(connection, role)
            if "function_bound" in tables:
                apply_function_bounds(connection, bounds)
            if platform_role:
                try:
                    apply_platform_grants(connection, platform_role, runtime_role=role)
                except PlatformRoleIsRuntimeRole as error:
                    raise MigrationFailed(f"grant failed: {error}") from None
            return tables
    finally:
        engine.dispose()
