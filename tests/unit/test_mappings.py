"""Mapping sources read the evaluation context, and fail loudly when they cannot."""

import uuid

import pytest

from orquestador.domain.errors import MappingError
from orquestador.domain.flow_definition import validate_definition
from orquestador.domain.mappings import (
    MAX_FORMATTED_VALUE_CHARACTERS,
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


# --- format: a text of the request data ---------------------------------------------------


def test_a_format_reads_the_request_data_into_one_line_of_text() -> None:
    context = build_context(
        {"machineId": "m-1", "reason": "kernel\nupdate", "gb": 250, "tags": ["a"]}, {}, "r", "new"
    )

    said = resolve_source(
        {"format": "Reboot {/data/machineId} ({/data/gb} GB, {/data/tags}): {/data/reason} {{ok}}"},
        context,
    )

    assert said == 'Reboot m-1 (250 GB, ["a"]): kernel update {ok}'


def test_a_long_value_is_cut_so_a_formatted_text_stays_bounded() -> None:
    said = resolve_source({"format": "{/data/x}!"}, build_context({"x": "y" * 500}, {}, "r", "s"))

    assert len(said) == MAX_FORMATTED_VALUE_CHARACTERS + 1
    assert said.endswith("…!")


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{/data/nope}", "does not resolve"),
        ("{/actions/a/x}", "does not read the request data"),
        ("a { b", "a lone"),
    ],
)
def test_a_format_that_cannot_be_filled_is_a_mapping_error(template: str, said: str) -> None:
    with pytest.raises(MappingError) as refused:
        resolve_source({"format": template}, build_context({}, {"a": {"x": 1}}, "r", "s"))

    assert said in refused.value.message


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("Reboot {/data/machineId", "a lone '{'"),
        ("Reboot } now", "a lone '}'"),
        ("{/request/id}", "must read the request data"),
        ("{/data/colour}", "dataSchema rules out"),
        ("{/data/machineId}" * 21, "at most 20"),
    ],
)
def test_publishing_refuses_a_format_that_could_never_be_filled(template: str, said: str) -> None:
    definition = {
        "key": "k",
        "trigger": "manual",
        "dataSchema": {
            "type": "object",
            "properties": {"machineId": {"type": "string"}},
            "additionalProperties": False,
        },
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "actions": [
                    {
                        "id": "a",
                        "capability": "c",
                        "version": 1,
                        "input": {"t": {"format": template}},
                    }
                ],
                "to": "done",
            }
        ],
    }

    errors, _ = validate_definition(definition)

    assert [p.path for p in errors] == ["/transitions/0/actions/0/input/t/format"]
    assert said in errors[0].message
