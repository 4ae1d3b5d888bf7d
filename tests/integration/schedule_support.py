"""Shared pieces of the schedule tests: a schedule flow, the API calls, and the database's view."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text

if TYPE_CHECKING:  # the API tests import this module by its bare name, crash tests by path
    from api_support import Api

SCHEDULE_SCOPES = ["flows:admin", "requests:read", "plans:admin"]

# A flow a schedule starts: its data schema is the fires' request data.
TICK: dict[str, Any] = {
    "key": "tick",
    "trigger": "schedule",
    "start": "run",
    "dataSchema": {
        "type": "object",
        "required": ["scheduleId", "fireTime", "data"],
        "properties": {
            "scheduleId": {"type": "string"},
            "fireTime": {"type": "string"},
            "data": {
                "type": "object",
                "properties": {"report": {"type": "string", "maxLength": 20}},
            },
        },
    },
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "run", "from": ["new"], "to": "done"}],
}


def schedule_flow(**changes: Any) -> dict[str, Any]:
    definition = copy.deepcopy(TICK)
    definition.update(changes)
    return {name: value for name, value in definition.items() if value is not None}


def who(**claims: Any) -> dict[str, Any]:
    return {"scopes": SCHEDULE_SCOPES, **claims}


def publish(api: Api, definition: dict[str, Any] | None = None, **claims: Any) -> str:
    return api.publish(definition or schedule_flow(), **who(**claims))["id"]


def put(api: Api, schedule_id: str, body: Any, **claims: Any):
    return api.client().put(
        f"/api/v1/schedules/{schedule_id}", json=body, headers=api.headers(**who(**claims))
    )


def get(api: Api, path: str, **claims: Any):
    return api.client().get(f"/api/v1{path}", headers=api.headers(**who(**claims)))


def make_due(engine: Engine, schedule_id: str, next_fire_at: datetime) -> None:
    """What downtime looks like: the next fire time is in the past."""
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE schedule SET next_fire_at = :at WHERE id = :id"),
            {"at": next_fire_at, "id": schedule_id},
        )


def fires(engine: Engine, schedule_id: str) -> list[tuple[datetime, Any, Any]]:
    """(fire time, request id, execution id) of every fire row, oldest first."""
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                text(
                    "SELECT fire_time, request_id, execution_id FROM schedule_fire"
                    " WHERE schedule_id = :id ORDER BY fire_time"
                ),
                {"id": schedule_id},
            )
        ]


def executions_per_fire_time(engine: Engine, schedule_id: str) -> dict[str, int]:
    """How many executions each fire time's requests have, read from the request data."""
    with engine.connect() as connection:
        return dict(
            connection.execute(
                text(
                    "SELECT r.data->>'fireTime', count(e.id) FROM request r"
                    " JOIN execution e ON e.request_id = r.id"
                    " WHERE r.data->>'scheduleId' = :id GROUP BY 1"
                ),
                {"id": schedule_id},
            ).all()
        )
