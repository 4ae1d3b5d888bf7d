"""A DATABASE_URL naming two hosts, the first dead: every way the product connects skips it."""

from __future__ import annotations

import threading
from urllib.parse import quote

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import URL

from orquestador.config import libpq_url
from orquestador.db import migrate
from orquestador.db.engine import make_engine
from orquestador.db.health import connection_problem
from orquestador.worker.listener import ReadyListener
from tests.db_support import RUNTIME_ROLE, TestDatabase

DEAD = "127.0.0.1:1"  # nothing listens on port 1


def dead_first(url: URL) -> str:
    """URL as a libpq host list whose first host refuses connections."""
    host = url.host or str(url.query.get("host", ""))
    live = quote(host, safe="") + (f":{url.port}" if url.port else "")
    who = quote(url.username or "", safe="")
    if url.password:
        who += ":" + quote(str(url.password), safe="")
    return (
        f"postgresql://{who}@{DEAD},{live}/{quote(url.database or '', safe='')}"
        "?target_session_attrs=read-write&connect_timeout=5"
    )


def test_engine_migrations_health_and_listener_use_the_second_host(
    database: TestDatabase,
) -> None:
    url = dead_first(database.owner_url)
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT pg_is_in_recovery()")).scalar() is False
    finally:
        engine.dispose()
    migrate.upgrade(migrate.alembic_config(url=url, runtime_role=RUNTIME_ROLE))
    assert migrate.current_revision(url) == migrate.head_revision()
    assert connection_problem(url) is None
    with psycopg.connect(libpq_url(url)) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (database.name,)

    wake = threading.Event()
    listener = ReadyListener(libpq_url(url), wake)
    listener.start()
    try:
        assert listener.listening.wait(15)
    finally:
        listener.stopped.set()
        listener.join(5)
