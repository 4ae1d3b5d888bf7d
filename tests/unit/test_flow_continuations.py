"""A flow's `continue`: what publishing refuses, what it and `flows lint` warn about."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from orquestador.domain.continuations import followed_by
from orquestador.domain.flow_definition import FlowDefinition, validate_definition
from orquestador.domain.lint import lint_definition

APPROVE_THEN_REBOOT: dict[str, Any] = {
    "key": "approved-reboot",
    "trigger": "manual",
    "initialState": "new",
    "states": ["new", "approved", "refused", "rebooted"],
    "continue": {"approved": "reboot"},
    "transitions": [
        {
            "id": "ask",
            "from": ["new"],
            "actions": [
                {
                    "id": "ok",
                    "capability": "approval",
                    "version": 1,
                    "input": {
                        "title": {"const": "Reboot?"},
                        "approvers": {"const": {"scope": "approvals:decide"}},
                        "deadlineSeconds": {"const": 60},
                    },
                }
            ],
            "decision": {
                "hitPolicy": "FIRST",
                "inputs": ["/actions/ok/decision"],
                "rules": [
                    {"id": "yes", "when": ['"approved"'], "then": {"to": "approved"}},
                    {"id": "no", "when": ["-"], "then": {"to": "refused"}},
                ],
            },
        },
        {"id": "reboot", "from": ["approved"], "actions": [], "to": "rebooted"},
    ],
}


def flow(**changes: Any) -> dict[str, Any]:
    definition = copy.deepcopy(APPROVE_THEN_REBOOT)
    definition.update(changes)
    return definition


def test_a_continuation_from_an_approved_state_publishes_cleanly_and_is_read() -> None:
    errors, warnings = validate_definition(flow())

    assert (errors, warnings) == ([], [])
    assert FlowDefinition.from_json(flow()).continuations == {"approved": "reboot"}
    assert lint_definition(flow()) == []


@pytest.mark.parametrize(
    ("continuing", "path", "said"),
    [
        ({"nowhere": "reboot"}, "/continue/nowhere", "unknown state 'nowhere'"),
        ({"approved": "fly"}, "/continue/approved", "unknown transition 'fly'"),
        ({"refused": "reboot"}, "/continue/refused", "does not leave state 'refused'"),
        ({"a/b": "reboot"}, "/continue/a~1b", "unknown state 'a/b'"),
        ({"approved": "not an id"}, "/continue/approved", "does not match"),
    ],
    ids=["state", "transition", "not-from", "escaped", "malformed"],
)
def test_publishing_refuses_a_continuation_that_cannot_run(
    continuing: dict[str, str], path: str, said: str
) -> None:
    errors, _ = validate_definition(flow(**{"continue": continuing}))

    assert [p.path for p in errors] == [path]
    assert said in errors[0].message


def test_a_cycle_of_continuations_with_nothing_that_waits_is_a_warning() -> None:
    spinning = flow(
        states=["new", "approved", "refused", "rebooted"],
        **{"continue": {"approved": "reboot", "rebooted": "again"}},
    )
    spinning["transitions"].append(
        {"id": "again", "from": ["rebooted"], "actions": [], "to": "approved"}
    )

    errors, warnings = validate_definition(spinning)

    assert errors == []
    assert [w.path for w in warnings] == ["/continue/approved", "/continue/rebooted"]
    assert "through reboot, again with nothing that waits" in warnings[0].message
    assert "MAX_CONTINUATIONS" in warnings[0].message


def test_a_cycle_through_a_wait_is_no_warning() -> None:
    waiting = flow(**{"continue": {"approved": "reboot", "rebooted": "ask-again"}})
    waiting["transitions"].append(
        {
            **copy.deepcopy(APPROVE_THEN_REBOOT["transitions"][0]),
            "id": "ask-again",
            "from": ["rebooted"],
        }
    )

    assert validate_definition(waiting) == ([], [])


def test_a_write_after_an_approval_in_its_transition_is_a_warning() -> None:
    writing = flow()
    writing["transitions"][0]["actions"].append(
        {"id": "send", "capability": "machine.command", "version": 1, "input": {}}
    )
    reading = flow()
    reading["transitions"][0]["actions"].append(
        {"id": "look", "capability": "machine.wait", "version": 1, "input": {}}
    )

    found = lint_definition(writing)

    assert [p.path for p in found] == ["/transitions/0/actions/1"]
    assert "runs after the approval 'ok' whatever its decision" in found[0].message
    assert lint_definition(reading) == []


def test_an_adapters_declared_effect_decides_what_may_write() -> None:
    reading_route = flow()
    reading_route["transitions"][0]["actions"].append(
        {"id": "fetch", "capability": "billing.read", "version": 1, "input": {}}
    )

    from orquestador.domain.action_contracts import ActionContract

    def contract_of(capability: str, version: int) -> ActionContract | None:
        reads = {"billing.read": True, "approval": True}
        if capability not in reads:
            return None
        return ActionContract(input_schema={"type": "object"}, reads_only=reads[capability])

    _, with_contract = validate_definition(reading_route, None, contract_of)
    _, without = validate_definition(reading_route)

    assert with_contract == []
    assert [w.path for w in without] == ["/transitions/0/actions/1"]


def test_a_dry_run_may_rehearse_the_steps_of_what_it_continues_into() -> None:
    chained = flow(**{"continue": {"approved": "reboot", "rebooted": "report"}})
    chained["states"].append("reported")
    chained["transitions"].append(
        {"id": "report", "from": ["rebooted"], "actions": [], "to": "reported"}
    )

    assert followed_by(chained, "ask") == ["reboot", "report"]
    assert followed_by(chained, "reboot") == ["report"]
    assert followed_by(chained, "report") == []
