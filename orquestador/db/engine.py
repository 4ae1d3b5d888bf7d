"""Engine creation and the classification of database errors worth retrying."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError, OperationalError

from orquestador.config import sqlalchemy_url

# SQLSTATE classes that say "try again later" rather than "this is wrong":
# 08 connection exception, 40 transaction rollback (serialization, deadlock),
# 53 insufficient resources, 57 operator intervention (e.g. admin shutdown).
_RETRIABLE_SQLSTATE_CLASSES = ("08", "40", "53", "57")


def make_engine(
    url: str, *, pool_size: int = 5, application_name: str = "orquestador", **kwargs: Any
) -> Engine:
    """An engine on psycopg 3 with a bounded pool; build it after any fork."""
    return create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=kwargs.pop("max_overflow", 2),
        pool_pre_ping=True,
        connect_args={"application_name": application_name, "connect_timeout": 10},
        **kwargs,
    )


def is_retriable(error: BaseException) -> bool:
    """True when the database said the failure is transient (connection, deadlock, resources)."""
    if isinstance(error, OperationalError) and error.connection_invalidated:
        return True
    if isinstance(error, DBAPIError):
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        if sqlstate.startswith(_RETRIABLE_SQLSTATE_CLASSES):
            return True
        return isinstance(error, OperationalError) and not sqlstate
    return False
