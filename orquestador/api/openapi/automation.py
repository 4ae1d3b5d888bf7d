"""OpenAPI paths and schemas of plans, platform events and dry runs; routes check bodies by them."""

from __future__ import annotations

from typing import Any

from orquestador.actions.rehearsals import OUTCOMES_SCHEMA
from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    flow_parameter,
    json_response,
    open_executions_429,
    problems,
    ref,
    transitions_quota_429,
)
from orquestador.automation.plans import MAX_PLAN_ID_CHARACTERS, MAX_PLAN_NAME_CHARACTERS
from orquestador.db.schema import MOMENTS

_UUID = {"type": "string", "format": "uuid"}
_PLAN_ID = {"type": "string", "minLength": 1, "maxLength": MAX_PLAN_ID_CHARACTERS}
_FLOW_ID_OR_NULL = {"oneOf": [_UUID, {"type": "null"}]}
_PROBLEM_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["path", "message"],
        "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
    },
}

PLAN_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": MAX_PLAN_NAME_CHARACTERS}
    },
}

BINDING_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["flowId"],
    "additionalProperties": False,
    "properties": {
        "flowId": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "description": "A flow of the caller's organization whose trigger is the moment: "
            "a version's id, or a key (its latest version now).",
        }
    },
}

PLAN: dict[str, Any] = {
    "type": "object",
    "required": ["id", "name", "bindings"],
    "properties": {
        "id": {**_PLAN_ID, "description": "The platform's own plan id."},
        "name": {"type": "string"},
        "bindings": {
            "type": "object",
            "required": list(MOMENTS),
            "description": "The flow bound to each moment, or null.",
            "properties": {moment: _FLOW_ID_OR_NULL for moment in MOMENTS},
        },
    },
}

EVENT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["id", "moment", "planId", "machineId"],
    "additionalProperties": False,
    "properties": {
        "id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "The sender's id: the same id again answers the first answer.",
        },
        "moment": {"enum": list(MOMENTS)},
        "planId": {**_PLAN_ID, "description": "The platform's plan id (PUT /plans/{planId})."},
        "machineId": {"type": "string", "minLength": 1, "maxLength": 200},
        "occurredAt": {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 with an offset; omitted, when the event was received.",
        },
        "data": {"type": "object", "description": "Passed to the flow as /data/event/data."},
    },
}

EVENT_STARTED: dict[str, Any] = {
    "type": "object",
    "required": ["eventId", "requestId", "executionId"],
    "properties": {
        "eventId": {"type": "string"},
        "requestId": _UUID,
        "executionId": _UUID,
        "differsFromRecorded": {"$ref": "#/components/schemas/EventDiffers"},
    },
}

EVENT_DIFFERS: dict[str, Any] = {
    "type": "array",
    "items": {"enum": ["moment", "planId", "machineId", "occurredAt", "data"]},
    "description": "Present when this id was received before with another body: the fields "
    "that differ. The answer is the recorded event's; this body was not kept (send a new "
    "event under a new id).",
}

EVENT_NOT_STARTED: dict[str, Any] = {
    "type": "object",
    "required": ["eventId", "started", "reason"],
    "properties": {
        "eventId": {"type": "string"},
        "started": {"const": False},
        "reason": {
            "enum": ["NO_BINDING", "REJECTED"],
            "description": "NO_BINDING: the plan binds no flow to the moment (or there is no "
            "such plan: see `plan`). REJECTED: the bound flow refused the event (`problems`, "
            "with paths into the request data).",
        },
        "plan": {
            "enum": ["unknown", "unbound"],
            "description": "With NO_BINDING: `unknown` when the organization has no plan "
            "with this planId, `unbound` when it has one that binds no flow to the moment.",
        },
        "problems": _PROBLEM_LIST,
        "differsFromRecorded": {"$ref": "#/components/schemas/EventDiffers"},
    },
}

DRY_RUN_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["data", "transition"],
    "additionalProperties": False,
    "properties": {
        "data": {"type": "object", "description": "Validated against the flow's dataSchema."},
        "transition": {"type": "string", "minLength": 1, "maxLength": 200},
        "state": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "The state the simulated request starts in; omitted, initialState.",
        },
        "outcomes": OUTCOMES_SCHEMA,
    },
}

DRY_RUN_ACCEPTED: dict[str, Any] = {
    "type": "object",
    "required": ["executionId", "requestId", "simulation"],
    "properties": {"executionId": _UUID, "requestId": _UUID, "simulation": {"const": True}},
}

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
    "PutPlan": PLAN_BODY,
    "Plan": PLAN,
    "PutBinding": BINDING_BODY,
    "PlatformEvent": EVENT_BODY,
    "EventStarted": EVENT_STARTED,
    "EventNotStarted": EVENT_NOT_STARTED,
    "EventDiffers": EVENT_DIFFERS,
    "DryRunRequest": DRY_RUN_BODY,
    "DryRunAccepted": DRY_RUN_ACCEPTED,
}

_PLAN_PARAMETER = {
    "name": "planId",
    "in": "path",
    "required": True,
    "schema": _PLAN_ID,
    "description": "The platform's own plan id, unique in the caller's organization.",
}
_MOMENT_PARAMETER = {
    "name": "moment",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "provisioned, reinstalled or deleted; any other is 404.",
}
_PLAN_404 = "No such plan in the caller's organization (another organization's: the same)."


def paths() -> dict[str, Any]:
    plan = {
        "get": {
            "operationId": "getPlan",
            "summary": "A plan and the flow bound to each moment",
            "description": "Scope `plans:admin`.",
            "security": SECURED,
            "parameters": [_PLAN_PARAMETER],
            "responses": {
                "200": json_response(ref("Plan"), "The plan."),
                **problems(*READ_ERRORS, s404=_PLAN_404),
            },
        },
        "put": {
            "operationId": "putPlan",
            "summary": "Create the plan, or rename it",
            "description": "Scope `plans:admin`. The plan id is the platform's own.",
            "security": SECURED,
            "parameters": [_PLAN_PARAMETER],
            "requestBody": body(ref("PutPlan")),
            "responses": {
                "200": json_response(ref("Plan"), "Renamed."),
                "201": json_response(ref("Plan"), "Created.", Location="The plan."),
                **problems(*WRITE_ERRORS),
            },
        },
    }
    binding = {
        "put": {
            "operationId": "bindPlanFlow",
            "summary": "Bind a flow to one moment of the plan (replacing any)",
            "description": "Scope `plans:admin`. The flow's trigger must be the moment.",
            "security": SECURED,
            "parameters": [_PLAN_PARAMETER, _MOMENT_PARAMETER],
            "requestBody": body(ref("PutBinding")),
            "responses": {
                "200": json_response(ref("Plan"), "Bound; the plan as it is now."),
                **problems(
                    *WRITE_ERRORS,
                    "404",
                    s404="No such plan, moment or flow in the caller's organization.",
                    s422="`BINDING_TRIGGER_MISMATCH`: the flow's trigger is not the moment "
                    "(nothing changed); or the body is invalid.",
                ),
            },
        },
        "delete": {
            "operationId": "unbindPlanFlow",
            "summary": "Remove the plan's binding for one moment",
            "description": "Scope `plans:admin`. Removing an absent binding succeeds.",
            "security": SECURED,
            "parameters": [_PLAN_PARAMETER, _MOMENT_PARAMETER],
            "responses": {
                "204": {"description": "No flow is bound to the moment now."},
                **problems(*READ_ERRORS, s404="No such plan or moment."),
            },
        },
    }
    events = {
        "post": {
            "operationId": "postEvent",
            "summary": "A platform event: start the flow bound to the plan's moment, once",
            "description": "Scope `events:write`. The event's `id` deduplicates per "
            "organization: the same id again (concurrently too) answers what the first "
            "delivery answered and never starts a second execution; with another body the "
            "answer also lists `differsFromRecorded`. The request data of "
            "the started flow is `{machineId, planId, event: {id, moment, occurredAt, data}}`.",
            "security": SECURED,
            "requestBody": body(ref("PlatformEvent")),
            "responses": {
                "202": json_response(
                    ref("EventStarted"),
                    "Started: the request and the accepted execution of the flow's `start`.",
                    Location="The execution.",
                ),
                "200": json_response(ref("EventNotStarted"), "Recorded; nothing started."),
                **problems(*WRITE_ERRORS),
                **transitions_quota_429(),
            },
        },
    }
    dry_runs = {
        "post": {
            "operationId": "startDryRun",
            "summary": "Simulate a transition of the flow on a simulated request",
            "description": "Scope `flows:admin`. The request and its execution are marked "
            "simulation: no adapter that writes is invoked (its `simulate` runs instead), "
            "they are hidden from normal lists and purged after SIMULATION_RETENTION_DAYS. "
            "Read the execution (Location) for `wouldHaveDone`.",
            "security": SECURED,
            "parameters": [flow_parameter()],
            "requestBody": body(ref("DryRunRequest")),
            "responses": {
                "202": json_response(
                    ref("DryRunAccepted"), "Queued.", Location="The simulated execution."
                ),
                **problems(
                    *WRITE_ERRORS,
                    "404",
                    s422="The data breaks the flow's dataSchema, or the state or transition "
                    "is unknown, or the transition does not leave the state; `problems` "
                    "lists each.",
                ),
                **open_executions_429(),
            },
        },
    }
    return {
        "/plans/{planId}": plan,
        "/plans/{planId}/bindings/{moment}": binding,
        "/events": events,
        "/flows/{flowId}/dry-runs": dry_runs,
    }
