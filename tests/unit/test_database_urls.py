"""Database URLs: a libpq host list (`h1:p1,h2:p2`) reads the same in every process."""

from __future__ import annotations

import psycopg.conninfo
import pytest
from sqlalchemy import create_engine

from orquestador.config import Settings, libpq_url, sqlalchemy_url
from orquestador.db.migrate import runtime_role_for
from orquestador.errors import ConfigError

TWO_HOSTS = "postgresql://app:s%40cret@db1:5432,db2:5433/orq?target_session_attrs=read-write"


def test_a_host_list_becomes_the_drivers_host_and_port_lists() -> None:
    url = sqlalchemy_url(TWO_HOSTS)
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.database) == ("app", "s@cret", "orq")
    assert url.query == {
        "host": "db1,db2",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
    }


def test_psycopg_reads_the_converted_url_as_the_same_hosts_in_order() -> None:
    assert psycopg.conninfo.conninfo_to_dict(libpq_url(TWO_HOSTS)) == {
        "user": "app",
        "password": "s@cret",
        "dbname": "orq",
        "host": "db1,db2",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
    }


def test_the_engine_hands_psycopg_every_host() -> None:
    engine = create_engine(sqlalchemy_url(TWO_HOSTS))
    _, params = engine.dialect.create_connect_args(engine.url)
    assert (params["host"], params["port"]) == ("db1,db2", "5432,5433")


@pytest.mark.parametrize(
    ("given", "hosts", "ports"),
    [
        ("postgresql://u@h1,h2/db", "h1,h2", None),
        ("postgres://u@h1:1,h2/db", "h1,h2", "1,"),
        ("postgresql://u@[::1]:5432,10.0.0.2:5433/db", "::1,10.0.0.2", "5432,5433"),
        ("postgresql://h1:6432,h2:6432", "h1,h2", "6432,6432"),
    ],
)
def test_host_list_forms(given: str, hosts: str, ports: str | None) -> None:
    query = sqlalchemy_url(given).query
    assert query["host"] == hosts
    assert query.get("port") == ports


def test_one_host_is_left_as_it_is() -> None:
    url = sqlalchemy_url("postgresql://u:p@db:5433/orq?sslmode=require")
    assert (url.host, url.port, dict(url.query)) == ("db", 5433, {"sslmode": "require"})
    assert libpq_url("postgresql://u:p@db:5433/orq") == "postgresql://u:p@db:5433/orq"


def test_settings_accept_a_host_list_and_refuse_a_broken_one() -> None:
    settings = Settings.from_env({"DATABASE_URL": TWO_HOSTS, "MIGRATION_DATABASE_URL": TWO_HOSTS})
    assert settings.database_url == TWO_HOSTS
    with pytest.raises(ConfigError, match="DATABASE_URL: not a database URL"):
        Settings.from_env({"DATABASE_URL": "postgresql://u@db1:x,db2/orq"})
    with pytest.raises(ConfigError, match="DATABASE_URL: not a database URL"):
        Settings.from_env({"DATABASE_URL": "postgresql://u@db1,db2/orq?host=db3"})


def test_the_runtime_role_is_the_host_lists_user() -> None:
    assert runtime_role_for(TWO_HOSTS) == "app"


def test_pool_settings_bound_each_pool_or_fit_the_threads() -> None:
    assert Settings.from_env({}).pool_size(12) == (12, 2)
    bounded = Settings.from_env({"DB_POOL_SIZE": "5", "DB_PREPARE": "false"})
    assert bounded.pool_size(12) == (5, 0) and bounded.db_prepare is False
    with pytest.raises(ConfigError, match="DB_POOL_SIZE must not be negative"):
        Settings.from_env({"DB_POOL_SIZE": "-1"})
    with pytest.raises(ConfigError, match="LISTEN_DATABASE_URL: not a PostgreSQL URL"):
        Settings.from_env({"LISTEN_DATABASE_URL": "mysql://db/app"})
