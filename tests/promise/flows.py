"""The flows the checker publishes: every effect class, in the orders that matter.

Each step names the planned case it runs for (the request's `case`, or the machine id
of a platform event's request), so the provider double can play that case's faults. The
`chained` flow's finish moves its request into a state that continues by itself: the
continuation is accepted in the finish's transaction, and must be, exactly once. The
`keyed` flow's executions take turns per `slot` (a concurrency key of limit KEY_LIMIT),
and its steps send the slot along, so the provider's ledger shows who overlapped. The
`approve` flow asks a person first (`approval@1`, its deadline the case's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.promise.adapters import BLIND_CHARGE, CHARGE, PUT, READ

EVENT_FLOW = "welcome"
KEYED_FLOW = "keyed"
KEY_LIMIT = 1
SLOTS = ("s-a", "s-b", "s-c")
APPROVAL_FLOW = "approve"
APPROVAL = "approval"
# A rollout (rollout@1) of the checkout flow over the case's items, ROLLOUT_BATCH at a
# time, stopping past ROLLOUT_MAX_FAILURES: each item's child is a case of its own.
ROLLOUT_FLOW = "fleet"
ROLLOUT = "rollout"
ROLLOUT_CHILD_FLOW = "checkout"
ROLLOUT_BATCH = 2
ROLLOUT_MAX_FAILURES = 1
MOMENT = "provisioned"
PLAN = "promise-plan"


@dataclass(frozen=True)
class Step:
    id: str
    capability: str


# name -> the steps of its one transition, in order.
FLOWS: dict[str, tuple[Step, ...]] = {
    # A read, a non-idempotent write with a look-up, then an idempotent write.
    "checkout": (Step("quote", READ), Step("charge", CHARGE), Step("receipt", PUT)),
    # An idempotent write, then a non-idempotent write nobody can look up.
    "blind": (Step("reserve", PUT), Step("charge", BLIND_CHARGE)),
    # A write, a read that may wait (WAITING: cancellable after the write), a charge.
    "provision": (Step("reserve", PUT), Step("ready", READ), Step("bill", CHARGE)),
    # Started by platform events: an idempotent write and a read.
    EVENT_FLOW: (Step("greet", PUT), Step("hello", READ)),
    # A write and a charge; its end continues by itself (CONTINUED).
    "chained": (Step("reserve", PUT), Step("charge", CHARGE)),
    # A read and a charge, one execution per slot at a time (a concurrency key); the
    # charge sends its slot along.
    KEYED_FLOW: (Step("hold", READ), Step("charge", CHARGE)),
    # A person's approval, then a write (run whatever the answer).
    APPROVAL_FLOW: (Step("ok", APPROVAL), Step("after", PUT)),
    # One checkout per item, a few at a time (a rollout).
    ROLLOUT_FLOW: (Step("all", ROLLOUT),),
}
MANUAL_FLOWS = ("checkout", "blind", "provision", "chained")
# The transition each flow's one transition ends in a state that continues with, from
# that state (name -> (state, transition, its steps)).
CONTINUED: dict[str, tuple[str, str, tuple[Step, ...]]] = {
    "chained": ("charged", "ship", (Step("ship", PUT), Step("track", READ))),
}
FIRST_TRANSITION = "go"
# A reboot sent to the case's machine and waited for, up to the case's own deadline: the
# checker's agents come before it or after it (command expiry, SPEC 23).
MACHINE_FLOW = "reboot"


def steps_of(flow: str, transition: str) -> tuple[Step, ...] | None:
    """The steps of one transition of the checker's flow (None: not the checker's)."""
    if transition == FIRST_TRANSITION:
        return FLOWS.get(flow)
    continued = CONTINUED.get(flow)
    return continued[2] if continued is not None and continued[1] == transition else None


def all_steps(flow: str) -> tuple[Step, ...]:
    """Every step a case of the flow may run, its continuation's included."""
    continued = CONTINUED.get(flow)
    return FLOWS[flow] + (continued[2] if continued is not None else ())


def definition(name: str) -> dict[str, Any]:
    """The flow's definition, as POST /flows takes it."""
    if name == MACHINE_FLOW:
        return _machine_definition()
    event = name == EVENT_FLOW
    case_pointer = "/data/machineId" if event else "/data/case"
    inputs: dict[str, Any] = {"case": {"from": case_pointer}}

    def action(step: Step) -> dict[str, Any]:
        if step.capability == ROLLOUT:
            return {
                "id": step.id,
                "capability": ROLLOUT,
                "version": 1,
                "input": {
                    "items": {"from": "/data/items"},
                    "flow": {"const": f"promise-{ROLLOUT_CHILD_FLOW}"},
                    "transition": {"const": FIRST_TRANSITION},
                    "data": {"const": {"case": "{/item}"}},
                    "batch": {"const": ROLLOUT_BATCH},
                    "maxFailures": {"const": ROLLOUT_MAX_FAILURES},
                },
                "onError": "review",
            }
        if step.capability == APPROVAL:
            return {
                "id": step.id,
                "capability": APPROVAL,
                "version": 1,
                "input": {
                    "title": {"format": "Promise {/data/case}"},
                    "approvers": {"const": {"scope": "approvals:decide"}},
                    "deadlineSeconds": {"from": "/data/approvalSeconds"},
                },
                "onError": "review",
            }
        # Only the keyed flow's charge reads the slot: a correction of it changes no
        # input of a step that already succeeded (that would be CONTRACT_MISMATCH).
        keyed = name == KEYED_FLOW and step.capability == CHARGE
        return {
            "id": step.id,
            "capability": step.capability,
            "version": 1,
            "input": {**inputs, "slot": {"from": "/data/slot"}} if keyed else inputs,
            "onError": "review",
        }

    def actions(steps: tuple[Step, ...]) -> list[dict[str, Any]]:
        return [action(step) for step in steps]

    continued = CONTINUED.get(name)
    first = {"id": FIRST_TRANSITION, "from": ["new"], "actions": actions(FLOWS[name])}
    flow: dict[str, Any] = {
        "key": f"promise-{name}",
        "trigger": MOMENT if event else "manual",
        "dataSchema": {
            "type": "object",
            "required": ["machineId" if event else "case"],
        },
        "initialState": "new",
        "states": ["new", "done", "review"],
        "transitions": [{**first, "to": "done"}],
    }
    if continued is not None:
        state, transition, steps = continued
        flow["states"].append(state)
        flow["transitions"] = [
            {**first, "to": state},
            {"id": transition, "from": [state], "actions": actions(steps), "to": "done"},
        ]
        flow["continue"] = {state: transition}
    if name == KEYED_FLOW:
        flow["dataSchema"]["required"] = ["case", "slot"]
        flow["dataSchema"]["properties"] = {"slot": {"type": "string"}, "note": {"type": "string"}}
        flow["transitions"][0]["concurrency"] = {"key": "/data/slot", "limit": KEY_LIMIT}
    if name == APPROVAL_FLOW:
        flow["dataSchema"]["required"] = ["case", "approvalSeconds"]
    if name == ROLLOUT_FLOW:
        flow["dataSchema"]["required"] = ["case", "items"]
    if event:
        flow["start"] = FIRST_TRANSITION
    return flow


def _machine_definition() -> dict[str, Any]:
    return {
        "key": f"promise-{MACHINE_FLOW}",
        "trigger": "manual",
        "dataSchema": {"type": "object", "required": ["case", "deadline"]},
        "initialState": "new",
        "states": ["new", "done", "review"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "actions": [
                    {
                        "id": "send",
                        "capability": "machine.command",
                        "version": 1,
                        "input": {
                            "machineId": {"from": "/data/case"},
                            "command": {"const": "reboot"},
                        },
                        "onError": "review",
                    },
                    {
                        "id": "wait",
                        "capability": "machine.wait",
                        "version": 1,
                        "input": {
                            "commandId": {"from": "/actions/send/commandId"},
                            "deadlineSeconds": {"from": "/data/deadline"},
                        },
                        "onError": "review",
                    },
                ],
                "to": "done",
            }
        ],
    }
