"""Which reads an output schema rules out: only those no valid output could satisfy."""

from __future__ import annotations

import pytest

from orquestador.domain.action_contracts import output_can_have

CLOSED = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["ok", "failed"]},
        "items": {"type": "array", "items": {"type": "object", "additionalProperties": False}},
        "extra": {},
    },
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("pointer", "possible"),
    [
        ([], True),
        (["id"], True),
        (["missing"], False),
        (["id", "x"], False),
        (["status", "x"], False),
        (["items", "0"], True),
        (["items", "first"], False),
        (["items", "0", "x"], False),
        (["extra", "anything", "deep"], True),
    ],
)
def test_a_closed_schema_rules_out_what_it_cannot_hold(pointer, possible) -> None:
    assert output_can_have(CLOSED, pointer) is possible


@pytest.mark.parametrize(
    "schema",
    [
        {},
        True,
        {"type": "object"},
        {"type": "object", "additionalProperties": False, "patternProperties": {"^x": {}}},
        {"anyOf": [{"type": "string"}, {"type": "object"}]},
        {"$ref": "#/$defs/x"},
        {"type": ["object", "array"], "additionalProperties": False},
    ],
)
def test_what_the_walk_cannot_judge_is_allowed(schema) -> None:
    assert output_can_have(schema, ["anything"]) is True
