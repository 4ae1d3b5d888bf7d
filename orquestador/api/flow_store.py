"""Publishing and reading flow rows; a stored flow is never updated, a new version is inserted."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, Row, func, select, text

from orquestador.api.body import unstorable_text
from orquestador.db.schema import flow

# The longest key a definition may have (its schema's pattern).
MAX_KEY_CHARACTERS = 100


def publish_flow(
    connection: Connection,
    *,
    org: str,
    key: str,
    trigger: str,
    definition: dict[str, Any],
    data_schema: dict[str, Any],
    created_by: str,
) -> Row:
    """Insert the next version of (org, key); call inside a transaction."""
    # Concurrent publishers of one key queue on a transaction-scoped advisory lock, so
    # max(version) + 1 is never computed twice; the unique (org_id, key, version)
    # constraint stays as the backstop.
    connection.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0))"),
        {"lock_key": f"flow\x1f{org}\x1f{key}"},
    )
    next_version = (
        select(func.coalesce(func.max(flow.c.version), 0) + 1)
        .where(flow.c.org_id == org, flow.c.key == key)
        .scalar_subquery()
    )
    inserted = connection.execute(
        flow.insert()
        .values(
            org_id=org,
            key=key,
            version=next_version,
            trigger=trigger,
            definition=definition,
            data_schema=data_schema,
            created_by=created_by,
        )
        .returning(flow.c.id, flow.c.key, flow.c.version, flow.c.trigger, flow.c.created_at)
    )
    return inserted.one()


def find_flow(connection: Connection, *, org: str, flow_id: uuid.UUID) -> Row | None:
    """A flow of this organization; another organization's flow does not exist here."""
    query = select(
        flow.c.id,
        flow.c.key,
        flow.c.version,
        flow.c.trigger,
        flow.c.definition,
        flow.c.data_schema,
        flow.c.created_by,
        flow.c.created_at,
    ).where(flow.c.id == flow_id, flow.c.org_id == org)
    return connection.execute(query).one_or_none()


def latest_flow(connection: Connection, *, org: str, key: str) -> Row | None:
    """The newest version of the organization's flow `key`, or None."""
    query = (
        select(
            flow.c.id,
            flow.c.key,
            flow.c.version,
            flow.c.trigger,
            flow.c.definition,
            flow.c.data_schema,
            flow.c.created_by,
            flow.c.created_at,
        )
        .where(flow.c.org_id == org, flow.c.key == key)
        .order_by(flow.c.version.desc())
        .limit(1)
    )
    return connection.execute(query).one_or_none()


def flow_by_reference(connection: Connection, *, org: str, reference: str) -> Row | None:
    """The flow a person names: a version's id, else a key's latest version; or None.

    What starts something (a run, a dry run) takes the latest version of a key: the
    version a person means when they name the flow.
    """
    try:
        flow_id = uuid.UUID(reference)
    except ValueError:
        if not 0 < len(reference) <= MAX_KEY_CHARACTERS or unstorable_text(reference):
            return None  # no key is that: nothing to look for
        return latest_flow(connection, org=org, key=reference)
    return find_flow(connection, org=org, flow_id=flow_id)
