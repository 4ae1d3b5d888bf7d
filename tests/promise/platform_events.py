"""The platform's own inserts into platform_event (its outbox), as its restricted role makes them.

Good events start the event flow for a machine; poison events are rows no consumer can
turn into a request: data nested 10,000 deep (stored by PostgreSQL, too deep for a
JSON decoder), a NUL character (which jsonb refuses, so the platform's own insert
fails), and data too large for a request.
"""

from __future__ import annotations

import json
import time

import psycopg

from tests.promise.api import ORG
from tests.promise.flows import MOMENT, PLAN

DEPTH = 10_000
HUGE_BYTES = 300 * 1024
AWAY_SECONDS = 30.0


def event_data(kind: str) -> str:
    """The event's data as the platform serializes it."""
    if kind == "deep":
        return '{"deep": ' + "[" * DEPTH + "]" * DEPTH + "}"
    if kind == "nul":
        return json.dumps({"note": "before\u0000after"})
    if kind == "huge":
        return json.dumps({"blob": "x" * HUGE_BYTES})
    return json.dumps({"hostname": "web-1"})


def insert_event(conninfo: str, name: str, kind: str) -> str:
    """Insert the event in the platform's own transaction; what became of the insert."""
    deadline = time.monotonic() + AWAY_SECONDS
    while True:
        try:
            with psycopg.connect(conninfo, connect_timeout=5) as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, data)"
                    " VALUES (%s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT DO NOTHING",
                    (ORG, name, MOMENT, PLAN, name, event_data(kind)),
                )
            return "inserted"
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
        except psycopg.DataError as refused:
            # The database refused the row itself: the platform's transaction failed
            # and nothing reached the outbox.
            return f"refused by the database at insert ({type(refused).__name__})"
