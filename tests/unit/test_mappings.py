"""Mapping sources read the evaluation context, and fail loudly when they cannot."""

import uuid

import pytest

from orquestador.domain.errors import MappingError
from orquestador.domain.mappings import (
    build_context,
    resolve_inputs,
    resolve_source,
    with_decision,
)


@pytest.fixture
def context():
    return build_context(
        data={"machineId": "m-1", "tags": ["a", "b"], "a/b": {"~k": 7}},
        action_outputs={"send": {"commandId": "c-9"}},
        request_id="r-1",
        state="new",
    )


def test_context_has_data_actions_and_request():
    request_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    ctx = build_context({"x": 1}, {"a": {"y": 2}}, request_id, "new")
    assert ctx == {
        "data": {"x": 1},
        "actions": {"a": {"y": 2}},
        "request": {"id": "12345678-1234-5678-1234-567812345678", "state": "new"},
    }


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("/data/machineId", "m-1"),
        ("/data/tags/1", "b"),
        ("/data/a~1b/~0k", 7),
        ("/actions/send/commandId", "c-9"),
        ("/request/state", "new"),
        ("/request/id", "r-1"),
    ],
)
def test_from_reads_a_json_pointer(context, pointer, expected):
    assert resolve_source({"from": pointer}, context) == expected


@pytest.mark.parametrize(
    "pointer", ["/data/missing", "/data/tags/2", "/data/tags/01", "/data/tags/-", "/actions/x"]
)
def test_unresolvable_pointer_fails_and_names_the_pointer(context, pointer):
    with pytest.raises(MappingError) as caught:
        resolve_source({"from": pointer}, context)
    assert pointer in caught.value.message
    assert caught.value.code == "MAPPING_FAILED"


def test_null_is_a_value_not_a_missing_pointer():
    ctx = build_context({"x": None}, {}, "r", "s")
    assert resolve_source({"from": "/data/x"}, ctx) is None


def test_const_gives_its_value(context):
    assert resolve_source({"const": {"deadline": 30}}, context) == {"deadline": 30}
    assert resolve_source({"const": None}, context) is None


def test_malformed_sources_are_mapping_errors(context):
    for source in ({}, {"from": "data/x"}, {"from": "/a~2"}, "nope"):
        with pytest.raises(MappingError):
            resolve_source(source, context)


def test_resolved_values_are_copies_so_adapters_cannot_edit_the_snapshot(context):
    tags = resolve_source({"from": "/data/tags"}, context)
    tags.append("c")
    assert context["data"]["tags"] == ["a", "b"]


def test_resolve_inputs_maps_every_field_and_names_the_failing_one(context):
    mapping = {"machineId": {"from": "/data/machineId"}, "command": {"const": "poweroff"}}
    assert resolve_inputs(mapping, context) == {"machineId": "m-1", "command": "poweroff"}
    with pytest.raises(MappingError) as caught:
        resolve_inputs({"commandId": {"from": "/actions/wait/id"}}, context)
    assert "commandId" in caught.value.message
    assert "/actions/wait/id" in caught.value.message


def test_with_decision_adds_the_decision_without_touching_the_original(context):
    extended = with_decision(context, {"ruleIds": ["ok"]})
    assert resolve_source({"from": "/decision/ruleIds/0"}, extended) == "ok"
    assert "decision" not in context
