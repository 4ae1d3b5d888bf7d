"""Moment- and schedule-triggered flows name the transition an event or a fire starts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from orquestador.domain.flow_definition import FlowDefinition, validate_definition

PROVISIONED: dict[str, Any] = {
    "key": "welcome",
    "trigger": "provisioned",
    "start": "greet",
    "initialState": "new",
    "states": ["new", "greeted"],
    "transitions": [
        {"id": "greet", "from": ["new"], "to": "greeted"},
        {"id": "again", "from": ["greeted"], "to": "greeted"},
    ],
}


def _flow(**changes: Any) -> dict[str, Any]:
    definition = copy.deepcopy(PROVISIONED)
    definition.update(changes)
    return {name: value for name, value in definition.items() if value is not None}


def _problems(definition: dict[str, Any]) -> list[tuple[str, str]]:
    errors, _ = validate_definition(definition)
    return [(p.path, p.message) for p in errors]


def test_a_moment_flow_with_a_start_leaving_the_initial_state_is_valid() -> None:
    assert validate_definition(_flow()) == ([], [])
    assert FlowDefinition.from_json(_flow()).start == "greet"


@pytest.mark.parametrize("moment", ["provisioned", "reinstalled", "deleted", "schedule"])
def test_a_moment_flow_without_start_is_refused_at_start(moment: str) -> None:
    [(path, message)] = _problems(_flow(trigger=moment, start=None))
    assert path == "/start"
    assert moment in message


def test_a_schedule_flow_with_a_start_is_valid() -> None:
    assert validate_definition(_flow(trigger="schedule")) == ([], [])


def test_a_start_naming_no_transition_is_refused() -> None:
    assert _problems(_flow(start="nowhere")) == [("/start", "unknown transition 'nowhere'")]


def test_a_start_that_does_not_leave_the_initial_state_is_refused() -> None:
    assert _problems(_flow(start="again")) == [
        ("/start", "transition 'again' does not leave the initial state 'new'")
    ]


def test_a_malformed_start_is_a_schema_problem_at_its_path() -> None:
    paths = [path for path, _ in _problems(_flow(start="a/b"))]
    assert paths == ["/start"]


def test_a_manual_flow_needs_no_start_and_is_warned_about_one() -> None:
    manual = _flow(trigger="manual", start=None)
    assert validate_definition(manual) == ([], [])
    errors, warnings = validate_definition(_flow(trigger="manual"))
    assert errors == []
    assert [w.path for w in warnings] == ["/start"]
    assert FlowDefinition.from_json(manual).start is None
