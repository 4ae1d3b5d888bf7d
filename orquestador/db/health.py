"""Database reachability, for `orquestador check`."""

from __future__ import annotations

from sqlalchemy import create_engine, pool, text

from orquestador.config import Settings, sqlalchemy_url


def unreachable_databases(settings: Settings) -> list[str]:
    """One line per configured database that does not answer `SELECT 1`."""
    problems = []
    for name, url in (
        ("DATABASE_URL", settings.database_url),
        ("MIGRATION_DATABASE_URL", settings.migration_database_url),
    ):
        if not url:
            continue
        engine = create_engine(
            sqlalchemy_url(url), poolclass=pool.NullPool, connect_args={"connect_timeout": 5}
        )
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception as error:
            reason = str(getattr(error, "orig", error)).strip().splitlines()
            problems.append(f"{name}: cannot connect: {reason[0] if reason else error}")
        finally:
            engine.dispose()
    return problems
