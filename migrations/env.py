"""Alembic environment: migrates the connection or URL handed in by orquestador.db.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from orquestador.db.schema import declared_relation, metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.attributes["url"], poolclass=pool.NullPool)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection: object) -> None:
    # One transaction for the whole upgrade: a failed step leaves nothing half applied.
    context.configure(
        connection=connection,
        target_metadata=metadata,
        transaction_per_migration=False,
        compare_type=True,
        # The history tables' monthly partitions are not declared (migration 0024).
        include_name=declared_relation,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run against a database")
run_migrations()
