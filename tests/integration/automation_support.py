"""Shared pieces of the plans, events and dry-run tests: moment flows and scopes."""

from __future__ import annotations

import copy
from typing import Any

from sqlalchemy import Engine, text

AUTOMATION_SCOPES = [
    "flows:admin",
    "requests:read",
    "requests:write",
    "plans:admin",
    "events:write",
]

# A provisioned flow whose data schema is the moment flows' request data.
WELCOME: dict[str, Any] = {
    "key": "welcome",
    "trigger": "provisioned",
    "start": "greet",
    "dataSchema": {
        "type": "object",
        "required": ["machineId", "planId", "event"],
        "properties": {
            "machineId": {"type": "string"},
            "planId": {"type": "string"},
            "event": {
                "type": "object",
                "required": ["id", "moment", "occurredAt", "data"],
                "properties": {
                    "id": {"type": "string"},
                    "moment": {"const": "provisioned"},
                    "occurredAt": {"type": "string"},
                    "data": {
                        "type": "object",
                        "properties": {"hostname": {"type": "string", "maxLength": 20}},
                    },
                },
            },
        },
    },
    "initialState": "new",
    "states": ["new", "greeted"],
    "transitions": [{"id": "greet", "from": ["new"], "to": "greeted"}],
}


def moment_flow(trigger: str = "provisioned", **changes: Any) -> dict[str, Any]:
    definition = copy.deepcopy(WELCOME)
    definition["key"] = f"welcome-{trigger}"
    definition["trigger"] = trigger
    definition["dataSchema"]["properties"]["event"]["properties"]["moment"] = {"const": trigger}
    definition.update(changes)
    # None removes a field.
    return {name: value for name, value in definition.items() if value is not None}


def count(engine: Engine, table: str) -> int:
    with engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
