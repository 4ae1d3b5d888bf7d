"""JSON Schemas of request and response bodies, shared by body checks and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from orquestador.db.schema import COMMAND_STATUSES, EXECUTION_STATUSES
from orquestador.domain.pointer_updates import MAX_CORRECTION_PATHS
from orquestador.domain.statuses import CheckpointStatus, StepStatus, values

_UUID = {"type": "string", "format": "uuid"}
_TIMESTAMP = {"type": "string", "format": "date-time"}
_PROBLEM_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["path", "message"],
        "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
    },
}

CREATE_REQUEST_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["flowId", "data"],
    "additionalProperties": False,
    "properties": {
        "flowId": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "description": "A flow of the caller's organization: a version's id, or a key "
            "(its latest version).",
        },
        "data": {
            "type": "object",
            "description": "Validated against the flow's dataSchema; at most 256 KiB as JSON.",
        },
        "machineId": {"type": "string", "minLength": 1, "maxLength": 200},
    },
}

TRANSITION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["transition", "expectedRevision"],
    "additionalProperties": False,
    "properties": {
        "transition": {"type": "string", "minLength": 1, "maxLength": 200},
        "expectedRevision": {"type": "integer", "minimum": 1, "maximum": 2147483647},
        "priority": {
            "type": "integer",
            "minimum": 0,
            "maximum": 9,
            "description": (
                "0-9, higher first within the organization; omitted, the flow's `priority`, else 5."
            ),
        },
        "simulation": {
            "type": "boolean",
            "description": (
                "Reserved for dry runs, which are not available yet: true is refused "
                "with 422 SIMULATION_NOT_AVAILABLE; false runs the transition."
            ),
        },
    },
}

RUN_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["flow", "transition", "data"],
    "additionalProperties": False,
    "properties": {
        "flow": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "description": "A flow key (its latest version starts) or a flow version's id.",
        },
        "transition": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "A transition that leaves the flow's initial state.",
        },
        "data": {
            "type": "object",
            "description": "Validated against the flow's dataSchema; at most 256 KiB as JSON.",
        },
        "priority": TRANSITION_BODY["properties"]["priority"],
        "machineId": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "The request's machine; omitted, the `machineId` of the data.",
        },
    },
}

RUN_STARTED: dict[str, Any] = {
    "type": "object",
    "required": ["requestId", "executionId", "flowId", "flowKey", "flowVersion"],
    "additionalProperties": False,
    "properties": {
        "requestId": _UUID,
        "executionId": _UUID,
        "flowId": {**_UUID, "description": "The flow version that runs (a key's latest)."},
        "flowKey": {"type": "string"},
        "flowVersion": {"type": "integer", "minimum": 1},
    },
}

FLOW_CREATED: dict[str, Any] = {
    "type": "object",
    "required": ["id", "key", "version", "trigger"],
    "properties": {
        "id": _UUID,
        "key": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "trigger": {"type": "string"},
        "warnings": _PROBLEM_LIST,
    },
}

FLOW: dict[str, Any] = {
    "type": "object",
    "required": ["id", "key", "version", "trigger", "createdBy", "createdAt", "definition"],
    "properties": {
        "id": _UUID,
        "key": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "trigger": {"type": "string"},
        "createdBy": {"type": "string"},
        "createdAt": _TIMESTAMP,
        "definition": {"type": "object"},
    },
}

REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["id", "flowId", "state", "revision", "data", "busy"],
    "properties": {
        "id": _UUID,
        "flowId": _UUID,
        "state": {"type": "string"},
        "revision": {"type": "integer", "minimum": 1},
        "data": {"type": "object"},
        "machineId": {"type": "string"},
        "executionId": {
            **_UUID,
            "description": "The unfinished execution, else the latest one.",
        },
        "busy": {
            "type": "boolean",
            "description": "An unfinished execution holds the request: no transition is accepted.",
        },
        "busyExecutionId": {
            **_UUID,
            "description": "The execution that holds the request, present while busy.",
        },
    },
}

TRANSITION_ACCEPTED: dict[str, Any] = {
    "type": "object",
    "required": ["executionId"],
    "properties": {"executionId": _UUID},
}

_CANCELLED_COMMANDS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["id", "machineId", "command"],
        "additionalProperties": False,
        "properties": {"id": _UUID, "machineId": {"type": "string"}, "command": {"type": "string"}},
    },
}
_MACHINE_COMMANDS_CANCELLED = {
    "type": "object",
    "required": ["cancelled", "stopRequested"],
    "additionalProperties": False,
    "description": "What a cancel did to the execution's machine commands (absent: no cancel). "
    "`cancelled`: commands no agent had taken, now `cancelled`; the agent never receives them. "
    "`stopRequested`: commands an agent had taken (sent or running), whose agent is told "
    "`cancelRequested` at its next status report or poll; they end when it reports "
    "(`cancelled` once it stopped the process).",
    "properties": {"cancelled": _CANCELLED_COMMANDS, "stopRequested": _CANCELLED_COMMANDS},
}

EXECUTION: dict[str, Any] = {
    "type": "object",
    "required": [
        "id",
        "requestId",
        "flowId",
        "transitionId",
        "status",
        "attempts",
        "priority",
        "steps",
        "createdAt",
        "updatedAt",
    ],
    "additionalProperties": False,
    "properties": {
        "id": _UUID,
        "requestId": _UUID,
        "flowId": _UUID,
        "transitionId": {"type": "string"},
        "status": {"enum": list(EXECUTION_STATUSES)},
        "flowKey": {"type": "string"},
        "flowVersion": {"type": "integer", "minimum": 1},
        "machineId": {
            "type": "string",
            "description": "The machine the request names, else the `machineId` of its data.",
        },
        "outcome": {"description": "The business outcome the decision table chose."},
        "toState": {"type": "string"},
        "errorCode": {"type": "string"},
        "errorDetail": {
            "type": "object",
            "description": (
                "Where the failure was: the action (`actionId`), the JSON Pointer that did not"
                " resolve (`pointer`, `field`), the schema paths that failed (`paths`,"
                " `problems`), the writes succeeded or in doubt. Names and paths, never values."
            ),
        },
        "nextAttemptAt": {
            **_TIMESTAMP,
            "description": "When a RETRY_WAIT execution becomes due again.",
        },
        "continuedFrom": {
            **_UUID,
            "description": (
                "The execution whose finish moved the request into a state the flow"
                " continues from, and accepted this one in the same transaction."
            ),
        },
        "parentExecutionId": {
            **_UUID,
            "description": "The rollout step's execution that started this one as a child.",
        },
        "continuedBy": {
            **_UUID,
            "description": (
                "The execution this one's finish continued into (the flow's `continue`):"
                " follow it to the end of the run."
            ),
        },
        "waitingForApproval": {
            **_UUID,
            "description": (
                "A WAITING execution whose step waits on a person's approval that can still be"
                " decided (open, before its deadline): that approval (`GET /approvals/{id}`)."
                " It moves again once someone decides, or at the deadline."
            ),
        },
        "cancelRequested": {
            "const": True,
            "description": (
                "A person asked to cancel the execution while a step's call was running (or"
                " a wait was being checked again): the call is not cut; the worker applies"
                " the cancel when it returns, by the write rule (CANCELLED, or parked"
                " `CANCELLED_AFTER_WRITES`). Absent otherwise."
            ),
        },
        "cancelRequestedAt": {"type": "string", "format": "date-time"},
        "cancelRequestedBy": {"type": "string", "description": "Who asked to cancel."},
        "attempts": {"type": "integer", "minimum": 0},
        "interruptedAttempts": {
            "type": "array",
            "description": (
                "The execution's attempts (as `attempts` counts them) whose worker stopped"
                " without ending them: found when another holder took the execution over"
                " (`foundAt`). A read writes no checkpoint before its call, so such an"
                " attempt may have left no line in any step's `attempts`."
            ),
            "items": {
                "type": "object",
                "required": ["attempt", "why", "foundAt"],
                "additionalProperties": False,
                "properties": {
                    "attempt": {"type": "integer", "minimum": 1},
                    "why": {"const": "WORKER_STOPPED"},
                    "foundAt": {"type": "string", "format": "date-time"},
                },
            },
        },
        "priority": {
            "type": "integer",
            "minimum": 0,
            "maximum": 9,
            "description": "Higher runs first within the organization (0-9).",
        },
        "traceId": {
            "type": "string",
            "pattern": "^[0-9a-f]{32}$",
            "description": (
                "The W3C trace id of the OpenTelemetry trace the execution belongs to, when"
                " it was accepted with tracing on: find it by this id in your tracing backend."
            ),
        },
        "blockedBy": {
            "type": "object",
            "description": (
                "A PENDING execution waiting for a place under its concurrency key: the key,"
                " its limit, how many hold it in the organization, and those holders the"
                " caller may read, oldest first."
            ),
            "required": ["key", "limit", "holders", "heldBy"],
            "additionalProperties": False,
            "properties": {
                "key": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "holders": {"type": "integer", "minimum": 0},
                "heldBy": {"type": "array", "items": _UUID},
            },
        },
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["actionId", "status", "attempts"],
                "additionalProperties": False,
                "properties": {
                    "actionId": {"type": "string"},
                    "status": {
                        "enum": list(values(StepStatus)),
                        "description": (
                            "WAITING: a durable wait between its rounds (the execution is"
                            " WAITING); it has not failed. STOPPED: a wait that ended"
                            " without its answer because the execution ended (cancelled)."
                        ),
                    },
                    "startedAt": {
                        **_TIMESTAMP,
                        "description": "The step's first start (a wait's first round).",
                    },
                    "waitingFor": {
                        "type": "object",
                        "description": (
                            "A WAITING step's command as it is now: machine, command,"
                            " status (`purged: true` when no such row exists any more), and"
                            " when the flow names the deadline, the deadline and the whole"
                            " seconds left at view time."
                        ),
                        "required": ["commandId"],
                        "additionalProperties": False,
                        "properties": {
                            "commandId": _UUID,
                            "machineId": {"type": "string"},
                            "command": {"type": "string"},
                            "args": {
                                "type": "array",
                                "description": "The command's arguments, as sent to the agent.",
                            },
                            "status": {"enum": list(COMMAND_STATUSES)},
                            "deliverBy": {
                                **_TIMESTAMP,
                                "description": "No agent is handed the command after it:"
                                " still pending then, it ends `expired`, never delivered.",
                            },
                            "output": {
                                "type": "string",
                                "description": "The command's output so far: its last 200"
                                " lines (the dropped part marked), once there is some.",
                            },
                            "outputBytes": {"type": "integer", "minimum": 0},
                            "outputTruncated": {"type": "boolean"},
                            "agent": {
                                "type": "object",
                                "description": "The machine's agent as seen now: `status`"
                                " online, offline (silent past AGENT_OFFLINE_SECONDS) or"
                                " never seen, `lastSeenAt`, `secondsSinceSeen` and `words`.",
                            },
                            "purged": {"const": True},
                            "deadline": _TIMESTAMP,
                            "secondsLeft": {"type": "integer", "minimum": 0},
                        },
                    },
                    "finishedAt": _TIMESTAMP,
                    "errorCode": {"type": "string"},
                    "nextAttemptAt": _TIMESTAMP,
                    "observed": {
                        "description": (
                            "Then: what the step saw when the flow decided, frozen in the"
                            " audit and never rewritten (a machine wait: `{commandId,"
                            " status, seenAt}`)."
                        ),
                    },
                    "current": {
                        "description": (
                            "Now: for an observation naming a machine command, its current"
                            " row read at view time within the caller's organization, or"
                            " `{purged: true}` when no such row exists any more."
                        ),
                        "oneOf": [
                            {
                                "type": "object",
                                "required": ["status", "updatedAt"],
                                "additionalProperties": False,
                                "properties": {
                                    "status": {"enum": list(COMMAND_STATUSES)},
                                    "updatedAt": _TIMESTAMP,
                                    "deliverBy": _TIMESTAMP,
                                    "output": {
                                        "type": "string",
                                        "description": "The command's output as it stands:"
                                        " its last 200 lines (the dropped part marked), once"
                                        " there is some. GET /machines/{machineId}/commands/"
                                        "{commandId}/output reads all that was kept.",
                                    },
                                    "outputBytes": {"type": "integer", "minimum": 0},
                                    "outputTruncated": {"type": "boolean"},
                                },
                            },
                            {
                                "type": "object",
                                "required": ["purged"],
                                "additionalProperties": False,
                                "properties": {"purged": {"const": True}},
                            },
                        ],
                    },
                    "attempts": {
                        "type": "array",
                        "description": "Every attempt of the step, oldest first.",
                        "items": {
                            "type": "object",
                            "required": ["attempt", "status", "startedAt"],
                            "additionalProperties": False,
                            "properties": {
                                "attempt": {"type": "integer", "minimum": 1},
                                "status": {
                                    "enum": list(values(StepStatus)),
                                    "description": (
                                        "UNKNOWN: the effect may have happened. An attempt"
                                        " interrupted mid-call ends FAILED (a read) or"
                                        " UNKNOWN (a write) with errorCode INTERRUPTED."
                                        " WAITING: a durable wait's attempt under way,"
                                        " between its rounds (startedAt: its first round);"
                                        " STOPPED: such an attempt the execution's end"
                                        " stopped."
                                    ),
                                },
                                "errorCode": {"type": "string"},
                                "message": {
                                    "type": "string",
                                    "maxLength": 1024,
                                    "description": (
                                        "The adapter's own words, cut to 1 KiB, with the"
                                        " call's input strings blanked out."
                                    ),
                                },
                                "startedAt": _TIMESTAMP,
                                "finishedAt": _TIMESTAMP,
                            },
                        },
                    },
                },
            },
        },
        "machineCommands": _MACHINE_COMMANDS_CANCELLED,
        "decision": {
            "type": "object",
            "description": (
                "How the destination was chosen, from the audit: `by: rules` (the decision"
                " table's hit policy and matched rules), `by: errorExit` (a failing step's"
                " declared error exit) or `by: operator` (a reconciliation gave up on it)."
                " Present once the execution has decided."
            ),
            "required": ["by", "toState", "outcome"],
            "additionalProperties": False,
            "properties": {
                "by": {"enum": ["rules", "errorExit", "operator"]},
                "hitPolicy": {"type": ["string", "null"]},
                "ruleIds": {"type": "array", "items": {"type": "string"}},
                "actionId": {"type": ["string", "null"]},
                "errorCode": {"type": ["string", "null"]},
                "toState": {"type": ["string", "null"]},
                "outcome": {"description": "The business outcome."},
            },
        },
        "simulation": {
            "const": True,
            "description": "Present on dry runs only: nothing was sent, written or called.",
        },
        "wouldHaveDone": {
            "type": "array",
            "description": "Dry runs only: each write the run would have made, in order.",
            "items": {
                "type": "object",
                "required": ["actionId", "capability", "effect", "summary"],
                "additionalProperties": False,
                "properties": {
                    "actionId": {"type": ["string", "null"]},
                    "capability": {"type": ["string", "null"]},
                    "effect": {"type": ["string", "null"]},
                    "summary": {"type": ["string", "null"]},
                    "continuesAs": {
                        **_UUID,
                        "description": "The dry run's continuation: the simulated execution"
                        " that carries on from the state this one reached.",
                    },
                    "wouldSend": {
                        "type": "object",
                        "description": "What a real run would have sent, as facts: "
                        "`machineId`, `command` and `args` of a machine command; `email` "
                        "and `recipients` (after the organization's opt-out) of a notice "
                        "or an approval; an approval's `approvers`.",
                    },
                },
            },
        },
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
    },
}

# Why an operator decides or cancels: kept in the audit trail, so it must say something.
_REASON = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2000,
    "pattern": "\\S",
    "description": "Why: what was checked, with whom. Kept in the audit trail.",
}
_STEP_STATUS = {"enum": list(values(CheckpointStatus))}
_NULLABLE_TEXT = {"type": ["string", "null"]}
_NULLABLE_TIMESTAMP = {"type": ["string", "null"], "format": "date-time"}

EXECUTION_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["items", "next"],
    "additionalProperties": False,
    "properties": {
        "items": {
            "type": "array",
            "items": EXECUTION,
            "description": (
                "Newest first. Dry runs (simulated executions) are left out; `simulation=true`"
                " lists only them."
            ),
        },
        "next": {
            "type": ["string", "null"],
            "description": "Pass as `after` for the next page; null on the last page.",
        },
    },
}

FLOW_VERSIONS: dict[str, Any] = {
    "type": "object",
    "required": ["items"],
    "additionalProperties": False,
    "properties": {
        "items": {
            "type": "array",
            "description": "Every version of every flow key, by key, newest version first.",
            "items": {
                "type": "object",
                "required": ["id", "key", "version", "trigger", "createdAt"],
                "additionalProperties": False,
                "properties": {
                    "id": _UUID,
                    "key": {"type": "string"},
                    "version": {"type": "integer", "minimum": 1},
                    "trigger": {"type": "string"},
                    "createdAt": _TIMESTAMP,
                },
            },
        }
    },
}

CAPABILITIES: dict[str, Any] = {
    "type": "object",
    "required": ["items"],
    "additionalProperties": False,
    "properties": {
        "items": {
            "type": "array",
            "description": "Every adapter the registry holds, by capability, then version.",
            "items": {
                "type": "object",
                "required": [
                    "capability",
                    "version",
                    "effect",
                    "inputSchema",
                    "outputSchema",
                    "canLookUp",
                    "canSimulate",
                    "timeoutSeconds",
                    "maxAttempts",
                ],
                "additionalProperties": False,
                "properties": {
                    "capability": {"type": "string"},
                    "version": {"type": "integer", "minimum": 1},
                    "effect": {"enum": ["READ_ONLY", "IDEMPOTENT_WRITE", "NON_IDEMPOTENT_WRITE"]},
                    "inputSchema": {
                        "type": ["object", "boolean"],
                        "description": "The JSON Schema the resolved inputs must meet.",
                    },
                    "outputSchema": {
                        "type": ["object", "boolean"],
                        "description": "The JSON Schema the adapter's output meets.",
                    },
                    "canLookUp": {
                        "type": "boolean",
                        "description": "The adapter can ask the provider whether a write "
                        "happened, before one is left to a person.",
                    },
                    "canSimulate": {
                        "type": "boolean",
                        "description": "A dry run can use it: it runs only in simulation, "
                        "or declares an example output.",
                    },
                    "timeoutSeconds": {"type": "number", "exclusiveMinimum": 0},
                    "maxAttempts": {"type": "integer", "minimum": 1},
                },
            },
        }
    },
}

EVIDENCE: dict[str, Any] = {
    "type": "object",
    "required": ["execution", "reason", "inDoubt", "steps", "audit"],
    "additionalProperties": False,
    "properties": {
        "execution": EXECUTION,
        "reason": {
            **_NULLABLE_TEXT,
            "description": "Why it parked (its error code) while RECONCILIATION_REQUIRED.",
        },
        "inDoubt": {
            **_NULLABLE_TEXT,
            "description": (
                "The step a decision names as `actionId` while parked; null when every step"
                " succeeded (decide without an actionId) or when nothing is to decide."
            ),
        },
        "steps": {
            "type": "array",
            "description": "Every checkpoint, in the order the actions started.",
            "items": {
                "type": "object",
                "required": [
                    "actionId",
                    "capability",
                    "version",
                    "effect",
                    "status",
                    "attempt",
                    "externalKey",
                    "inputHash",
                    "errorCode",
                    "message",
                    "startedAt",
                    "finishedAt",
                    "attempts",
                ],
                "additionalProperties": False,
                "properties": {
                    "actionId": {"type": "string"},
                    "capability": {"type": "string"},
                    "version": {"type": "integer"},
                    "effect": {"enum": ["READ_ONLY", "IDEMPOTENT_WRITE", "NON_IDEMPOTENT_WRITE"]},
                    "status": _STEP_STATUS,
                    "attempt": {"type": "integer", "minimum": 0},
                    "externalKey": {
                        "type": "string",
                        "description": "The idempotency key the provider saw: search its records.",
                    },
                    "inputHash": {
                        "type": "string",
                        "description": "Canonical hash of the input the step was called with.",
                    },
                    "errorCode": _NULLABLE_TEXT,
                    "message": {
                        **_NULLABLE_TEXT,
                        "description": "The current attempt's stored message, cut to 1 KiB.",
                    },
                    "startedAt": _NULLABLE_TIMESTAMP,
                    "finishedAt": _NULLABLE_TIMESTAMP,
                    "output": {"description": "Only on SUCCEEDED steps: what the step returned."},
                    "attempts": EXECUTION["properties"]["steps"]["items"]["properties"]["attempts"],
                },
            },
        },
        "audit": {
            "type": "array",
            "description": "The execution's audit trail, oldest first.",
            "items": {
                "type": "object",
                "required": ["kind", "at", "detail"],
                "additionalProperties": False,
                "properties": {
                    "kind": {"type": "string"},
                    "at": _TIMESTAMP,
                    "actor": {"type": "string"},
                    "detail": {"type": "object"},
                },
            },
        },
    },
}

RECONCILIATION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["actionId", "decision", "reason"],
    "additionalProperties": False,
    "properties": {
        "actionId": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": 200,
            "description": "The step in doubt (the evidence's inDoubt); null when none is.",
        },
        "decision": {
            "enum": ["confirm", "retry", "fail"],
            "description": (
                "confirm: the effect happened (output required); retry: it did not, run the"
                " step again with the same external key; fail: give up."
            ),
        },
        "reason": _REASON,
        "output": {
            "type": "object",
            "description": "confirm only: the step's output, checked against the adapter's schema.",
        },
        "toState": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": (
                "fail only: where the request goes; default the step's onError state, else"
                " the state it was accepted in."
            ),
        },
        "correction": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_CORRECTION_PATHS,
            "description": (
                "retry only: changes to the request data, applied in order in the same"
                " transaction as the retry, so the step runs again with them. The corrected"
                " data is checked against the flow's dataSchema and the 256 KiB limit; a"
                " refused correction is 422 `CORRECTION_INVALID` and nothing is written."
                " The request takes a new revision; the audit row keeps each path's value"
                " before and after."
            ),
            "items": {
                "type": "object",
                "required": ["path"],
                "oneOf": [{"required": ["value"]}, {"required": ["text"]}],
                "additionalProperties": False,
                "properties": {
                    "path": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1024,
                        "description": (
                            "A JSON Pointer into the request data, as a flow's `updates`"
                            " address it: `/amount`, not `/data/amount`. One path each: no"
                            " path inside another of the same correction, no `-`."
                        ),
                    },
                    "value": {"description": "The value the path holds from now on (any JSON)."},
                    "text": {
                        "type": "string",
                        "maxLength": 65536,
                        "description": (
                            "Instead of `value`: the new value as a person typed it. The"
                            " flow's dataSchema at the path decides: a field that holds"
                            ' text takes it as is (`large`, or `"large"` with quotes);'
                            " any other field reads it as JSON (`950`). Text the schema"
                            " cannot place is 422 `CORRECTION_INVALID`, saying how to"
                            " quote it."
                        ),
                    },
                },
            },
        },
    },
}

CANCEL_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["reason"],
    "additionalProperties": False,
    "properties": {"reason": _REASON},
}

# The cancel's answer: the execution as it is now, and what became of its machine commands.
CANCELLED_EXECUTION: dict[str, Any] = {
    **EXECUTION,
    "required": [*EXECUTION["required"], "machineCommands"],
}

PROBLEM: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "code"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "code": {"type": "string"},
        "detail": {"type": "string"},
        "problems": _PROBLEM_LIST,
    },
}

HEALTH: dict[str, Any] = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"const": "ok"}},
}
