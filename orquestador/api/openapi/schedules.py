"""OpenAPI paths and schemas of schedules; the routes check bodies by them."""

from __future__ import annotations

from typing import Any

from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    json_response,
    open_executions_429,
    problems,
    ref,
)
from orquestador.automation.schedules import MAX_SCHEDULE_ID_CHARACTERS
from orquestador.domain.schedule_times import (
    CATCH_UP_POLICIES,
    MAX_CRON_CHARACTERS,
    MAX_EVERY_SECONDS,
    MAX_TIMEZONE_CHARACTERS,
)

_UUID = {"type": "string", "format": "uuid"}
_TIMESTAMP_OR_NULL = {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}
_SCHEDULE_ID = {"type": "string", "minLength": 1, "maxLength": MAX_SCHEDULE_ID_CHARACTERS}
# The most schedules GET /schedules lists.
LIST_LIMIT = 1000

_CRON = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_CRON_CHARACTERS,
    "description": "Five fields, minute hour day-of-month month day-of-week, read on the "
    "wall clock of `timezone`. Exactly one of `cron` and `everySeconds`.",
}
_EVERY = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_EVERY_SECONDS,
    "description": "A fire every this many seconds, the first one period after the "
    "schedule was put. Exactly one of `cron` and `everySeconds`.",
}
_TIMEZONE = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TIMEZONE_CHARACTERS,
    "description": "An IANA time zone name; omitted, UTC.",
}
_CATCH_UP = {
    "enum": list(CATCH_UP_POLICIES),
    "description": "What to do with fire times that passed while no worker ran: `skip` "
    "starts none that is more than 60 seconds late, `one` starts the latest only, `all` "
    "starts each of the latest 100. Omitted, `skip`.",
}

_FLOW = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "The flow each fire starts: a key of the caller's organization (each "
    "fire starts its latest version) or a flow version's id (each fire starts that "
    "version). Any trigger: a `schedule` flow's request data is `{scheduleId, fireTime, "
    "data}`, any other flow's is `data` itself. Exactly one of `flow` and `flowId`.",
}
_TRANSITION = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "The transition each fire accepts on its new request (it must leave the "
    "flow's initial state); omitted, the flow's `start`.",
}

SCHEDULE_BODY: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "flow": _FLOW,
        "flowId": {
            **_UUID,
            "description": "A flow version of the caller's organization (as `flow` with a "
            "version's id). Exactly one of `flow` and `flowId`.",
        },
        "transition": _TRANSITION,
        "cron": _CRON,
        "everySeconds": _EVERY,
        "timezone": _TIMEZONE,
        "data": {
            "type": "object",
            "description": "Each fire's request data (a `schedule` flow's: under "
            "/data/data); omitted, {}. Its `machineId`, if any, is the requests' machine.",
        },
        "catchUp": _CATCH_UP,
        "paused": {"type": "boolean", "description": "A paused schedule never fires."},
    },
}

SCHEDULE: dict[str, Any] = {
    "type": "object",
    "required": [
        "id",
        "flow",
        "flowId",
        "flowKey",
        "transition",
        "timezone",
        "data",
        "catchUp",
        "paused",
        "nextFireAt",
        "lastFiredAt",
        "missed",
    ],
    "properties": {
        "id": {**_SCHEDULE_ID, "description": "The caller's own schedule id."},
        "flow": {**_FLOW, "description": "The flow as put: its key, or a version's id."},
        "flowId": {**_UUID, "description": "The flow version the schedule was put with."},
        "flowKey": {
            "type": ["string", "null"],
            "description": "The flow's key when named by key (each fire: its latest version).",
        },
        "transition": {
            "type": ["string", "null"],
            "description": "The transition each fire accepts; null: the flow's `start`.",
        },
        "cron": _CRON,
        "everySeconds": _EVERY,
        "timezone": _TIMEZONE,
        "data": {"type": "object"},
        "catchUp": _CATCH_UP,
        "paused": {"type": "boolean"},
        "nextFireAt": {
            **_TIMESTAMP_OR_NULL,
            "description": "The next fire time not yet handled (in the past while a worker "
            "catches up); null while paused.",
        },
        "lastFiredAt": {
            **_TIMESTAMP_OR_NULL,
            "description": "The latest fire time that started an execution.",
        },
        "missed": {
            "type": "integer",
            "minimum": 0,
            "description": "Fire times that passed without an execution: the catch-up "
            "policy let them go.",
        },
        "createdAt": {"type": "string", "format": "date-time"},
        "updatedAt": {"type": "string", "format": "date-time"},
    },
}

SCHEDULE_FIRED: dict[str, Any] = {
    "type": "object",
    "required": ["scheduleId", "fireTime", "requestId", "executionId"],
    "additionalProperties": False,
    "properties": {
        "scheduleId": _SCHEDULE_ID,
        "fireTime": {"type": "string", "format": "date-time"},
        "requestId": _UUID,
        "executionId": _UUID,
    },
}

SCHEDULE_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["items"],
    "properties": {"items": {"type": "array", "items": ref("Schedule")}},
}

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
    "PutSchedule": SCHEDULE_BODY,
    "Schedule": SCHEDULE,
    "ScheduleFired": SCHEDULE_FIRED,
    "ScheduleList": SCHEDULE_LIST,
}

_SCHEDULE_PARAMETER = {
    "name": "scheduleId",
    "in": "path",
    "required": True,
    "schema": _SCHEDULE_ID,
    "description": "The caller's own schedule id, unique in the caller's organization.",
}
_SCHEDULE_404 = "No such schedule in the caller's organization (another organization's: the same)."


def paths() -> dict[str, Any]:
    one = {
        "get": {
            "operationId": "getSchedule",
            "summary": "A schedule and where its firing stands",
            "description": "Scope `plans:admin`.",
            "security": SECURED,
            "parameters": [_SCHEDULE_PARAMETER],
            "responses": {
                "200": json_response(ref("Schedule"), "The schedule."),
                **problems(*READ_ERRORS, s404=_SCHEDULE_404),
            },
        },
        "put": {
            "operationId": "putSchedule",
            "summary": "Create the schedule, or replace it",
            "description": "Scope `plans:admin`. Each fire time starts the flow's transition "
            "(`transition`, else its `start`) once, on a new request: a `schedule` flow's "
            "data is `{scheduleId, fireTime, data}`, any other flow's is `data`. The next "
            "fire time is kept when the timing is unchanged and the schedule stays running; "
            "otherwise it is the first after now.",
            "security": SECURED,
            "parameters": [_SCHEDULE_PARAMETER],
            "requestBody": body(ref("PutSchedule")),
            "responses": {
                "200": json_response(ref("Schedule"), "Replaced."),
                "201": json_response(ref("Schedule"), "Created.", Location="The schedule."),
                **problems(
                    *WRITE_ERRORS,
                    "404",
                    s404="No such flow in the caller's organization.",
                    s422="`SCHEDULE_INVALID`: the cron, period or time zone cannot be used, "
                    "or not exactly one of `cron` and `everySeconds` is given; "
                    "`SCHEDULE_TRANSITION_INVALID`: the transition (or the flow's `start`) "
                    "does not leave the flow's initial state; `DATA_INVALID`: the flow's "
                    "dataSchema refuses the data a fire gives; `CONCURRENCY_KEY_MISSING`; "
                    "`SCHEDULE_ID_INVALID`; or the body is invalid (`BODY_INVALID`, also "
                    "for neither or both of `flow` and `flowId`). Nothing is written.",
                ),
            },
        },
        "delete": {
            "operationId": "deleteSchedule",
            "summary": "Delete the schedule",
            "description": "Scope `plans:admin`. What it started stays.",
            "security": SECURED,
            "parameters": [_SCHEDULE_PARAMETER],
            "responses": {
                "204": {"description": "Deleted."},
                **problems(*READ_ERRORS, s404=_SCHEDULE_404),
            },
        },
    }
    listing = {
        "get": {
            "operationId": "listSchedules",
            "summary": "The organization's schedules, by id",
            "description": f"Scope `plans:admin`. At most {LIST_LIMIT}.",
            "security": SECURED,
            "responses": {
                "200": json_response(ref("ScheduleList"), "The schedules."),
                **problems("401", "403", "414", "431"),
            },
        },
    }
    runs = {
        "post": {
            "operationId": "runSchedule",
            "summary": "Fire the schedule once, now",
            "description": "Scope `plans:admin`. One fire at the present instant, paused "
            "or not, through the same path as a fire time (recorded among the schedule's "
            "fires, its execution started by the schedule), owned by the caller. Its "
            "timing and next fire time are left as they are.",
            "security": SECURED,
            "parameters": [_SCHEDULE_PARAMETER],
            "responses": {
                "201": json_response(ref("ScheduleFired"), "Started.", Location="The execution."),
                **problems(
                    *READ_ERRORS,
                    "422",
                    "503",
                    s404=_SCHEDULE_404,
                    s422="The flow refuses the fire now (`DATA_INVALID`, "
                    "`SCHEDULE_TRANSITION_INVALID`, `CONCURRENCY_KEY_MISSING`): nothing is "
                    "written.",
                ),
                **open_executions_429(),
            },
        }
    }
    return {
        "/schedules": listing,
        "/schedules/{scheduleId}": one,
        "/schedules/{scheduleId}/runs": runs,
    }
