"""Updates write request data through JSON Pointer; the result is checked before it is kept."""

import contextlib
import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonpointer import JsonPointer
from jsonschema import Draft202012Validator

from orquestador.domain.canonical import canonical_json
from orquestador.domain.errors import DataSchemaError, DataValidationError, UpdateError
from orquestador.domain.mappings import find, pointer_parts
from orquestador.domain.pointer_updates import (
    MAX_CORRECTION_PATHS,
    MAX_MESSAGE_CHARS,
    MAX_PROBLEMS,
    apply_updates,
    correct_request_data,
    data_before_corrections,
    validate_request_data,
)
from orquestador.domain.schemas import validator_for


def test_sets_keys_and_replaces_existing_array_positions():
    data = {"power": "on", "disks": [{"size": 1}, {"size": 2}]}
    updated = apply_updates(data, [("/power", "off"), ("/disks/1/size", 4), ("/disks/0", None)])
    assert updated == {"power": "off", "disks": [None, {"size": 4}]}


def test_missing_object_parents_are_created_as_objects():
    updated = apply_updates({}, [("/billing/invoice/id", "inv-1")])
    assert updated == {"billing": {"invoice": {"id": "inv-1"}}}


def test_escaped_tokens_name_keys_with_slash_and_tilde():
    assert apply_updates({}, [("/a~1b/c~0d", 1)]) == {"a/b": {"c~d": 1}}


def test_later_writes_win():
    assert apply_updates({}, [("/x", 1), ("/x", 2)]) == {"x": 2}


def test_input_and_written_values_are_not_shared_with_the_result():
    data = {"list": [1]}
    value = {"nested": [1]}
    updated = apply_updates(data, [("/copy", value)])
    value["nested"].append(2)
    updated["list"].append(2)
    assert data == {"list": [1]}
    assert updated["copy"] == {"nested": [1]}


@pytest.mark.parametrize(
    "path",
    [
        "",  # would replace the whole document
        "/disks/2",  # index == len is an append
        "/disks/7",  # sparse
        "/disks/-",  # append token
        "/disks/01",  # leading zero
        "/disks/x",  # not an index
        "/disks/-1",
        "/power/state",  # into a scalar
        "power",  # not a pointer
        "/a~2",  # bad escape
    ],
)
def test_rejected_updates(path):
    data = {"power": "on", "disks": [1, 2]}
    with pytest.raises(UpdateError) as caught:
        apply_updates(data, [(path, 1)])
    assert caught.value.code == "INVALID_UPDATE"


SCHEMA = {
    "type": "object",
    "properties": {
        "machineId": {"type": "string"},
        "cpus": {"type": "integer", "minimum": 1},
        "owner": {"type": "object", "properties": {"email": {"format": "email"}}},
    },
    "required": ["machineId"],
}


def test_valid_data_passes():
    validate_request_data({"machineId": "m", "cpus": 2}, SCHEMA)


def test_every_schema_error_is_listed_with_its_pointer():
    with pytest.raises(DataValidationError) as caught:
        validate_request_data({"cpus": 0, "owner": {"email": "nope"}}, SCHEMA)
    paths = sorted(p.path for p in caught.value.problems)
    assert paths == ["", "/cpus", "/owner/email"]
    assert caught.value.code == "DATA_INVALID"


def test_size_limit_counts_canonical_bytes():
    data = {"machineId": "x" * 100}
    size = len(canonical_json(data))
    validate_request_data(data, SCHEMA, max_bytes=size)
    with pytest.raises(DataValidationError) as caught:
        validate_request_data(data, SCHEMA, max_bytes=size - 1)
    assert [p.as_dict()["path"] for p in caught.value.problems] == [""]
    assert str(size) in caught.value.problems[0].message


def test_an_invalid_schema_is_a_data_validation_error():
    with pytest.raises(DataValidationError) as caught:
        validate_request_data({}, {"type": "objekt"})
    assert caught.value.problems[0].path == "/dataSchema/type"
    assert isinstance(caught.value, DataSchemaError)
    assert caught.value.code == "DATA_SCHEMA_INVALID"


def test_oversized_data_gets_only_the_size_problem():
    data = {"machineId": 5, "cpus": "x" * 300}
    with pytest.raises(DataValidationError) as caught:
        validate_request_data(data, SCHEMA, max_bytes=100)
    assert [p.path for p in caught.value.problems] == [""]
    assert "the limit is 100" in caught.value.problems[0].message


def test_data_nested_deeper_than_64_levels_is_refused_before_validation():
    data: dict = {}
    deepest = data
    for _ in range(70):
        deepest["a"] = {}
        deepest = deepest["a"]
    with pytest.raises(DataValidationError) as caught:
        validate_request_data(data, {"type": "object"})
    assert caught.value.problems[0].message == "nests deeper than 64 levels"


def test_problems_are_capped_and_messages_shortened():
    schema = {"type": "array", "items": {"type": "string"}}
    with pytest.raises(DataValidationError) as caught:
        validate_request_data([[n] * 200 for n in range(150)], schema)
    problems = caught.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].message == "and 50 more problems"
    assert all(len(p.message) <= MAX_MESSAGE_CHARS for p in problems)


# --- the validator agrees with jsonschema's own where both are safe --------------------

_SAFE_PATTERNS = st.sampled_from(["^a", "b$", "a+b", "^[ab]*$", "[0-9]", "^$"])
_INSTANCES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.0, 1.0, 1.5, -0.0, 2.0])
    | st.sampled_from(["", "a", "ab", "b1", "ba"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "ab", "1", "ba"]), inner, max_size=4)
    ),
    max_leaves=10,
)


def _keyword_schemas(inner):
    return st.one_of(
        st.fixed_dictionaries({"uniqueItems": st.booleans()}),
        st.fixed_dictionaries({"enum": st.lists(_INSTANCES, min_size=1, max_size=4)}),
        st.fixed_dictionaries({"const": _INSTANCES}),
        st.fixed_dictionaries({"pattern": _SAFE_PATTERNS}),
        st.fixed_dictionaries({"multipleOf": st.sampled_from([1, 2, 0.5, 1.5])}),
        st.fixed_dictionaries(
            {
                "patternProperties": st.dictionaries(_SAFE_PATTERNS, inner, max_size=2),
                "additionalProperties": st.booleans() | inner,
            },
            optional={"properties": st.dictionaries(st.sampled_from(["a", "b"]), inner)},
        ),
        st.fixed_dictionaries({"items": inner, "uniqueItems": st.just(True)}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
    )


_SCHEMAS = st.recursive(st.just({}), _keyword_schemas, max_leaves=6)


def _errors(validator, instance):
    return sorted((list(e.absolute_path), e.message) for e in validator.iter_errors(instance))


@given(_SCHEMAS, _INSTANCES)
def test_the_safe_validator_finds_what_jsonschema_finds(schema, instance):
    stock = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert _errors(validator_for(schema), instance) == _errors(stock, instance)


# --- properties ---------------------------------------------------------------

_TOKENS = st.sampled_from(["a", "b", "0", "1", "01", "-", "~0", "~1", "", "x/y", "~2"])
_PATHS = st.one_of(
    st.lists(_TOKENS, max_size=4).map(lambda ts: "".join("/" + t for t in ts)),
    st.text(max_size=8),
)
_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "0", "1", "~", "/"]), inner, max_size=3)
    ),
    max_leaves=12,
)
_DATA = st.dictionaries(st.sampled_from(["a", "b", "0", "1"]), _JSON, max_size=4)


@given(_DATA, st.lists(st.tuples(_PATHS, _JSON), max_size=5))
def test_apply_never_mutates_and_only_raises_update_error(data, updates):
    before = copy.deepcopy(data)
    with contextlib.suppress(UpdateError):
        apply_updates(data, updates)
    assert data == before


_KEYS = st.sampled_from(["p", "q", "r/s", "t~u"])
_KEY_PATHS = st.lists(_KEYS, min_size=1, max_size=3).map(tuple)


def _prefix_free(paths):
    return not any(a != b and b[: len(a)] == a for a in paths for b in paths)


@given(
    st.dictionaries(st.sampled_from(["a", "b"]), _JSON, max_size=3),
    st.lists(st.tuples(_KEY_PATHS, _JSON), min_size=1, max_size=6).filter(
        lambda ups: _prefix_free({p for p, _ in ups})
    ),
)
def test_reading_back_each_path_gives_the_last_value_written(data, updates):
    writes = [(JsonPointer.from_parts(list(parts)).path, value) for parts, value in updates]
    updated = apply_updates(data, writes)
    last = dict(writes)
    for path, value in last.items():
        assert find(updated, pointer_parts(path)) == (True, value)
    for key, value in data.items():
        assert updated[key] == value


# --- an operator's correction ----------------------------------------------------------

CHECKOUT = {
    "type": "object",
    "required": ["amount"],
    "additionalProperties": False,
    "properties": {
        "amount": {"type": "integer", "minimum": 1},
        "card": {"type": "object", "properties": {"last4": {"type": "string"}}},
        "notes": {"type": "string"},
    },
}


def test_a_correction_writes_each_path_and_says_what_was_there_before():
    data = {"amount": 900, "card": {"last4": "1111"}}
    corrected, changes = correct_request_data(
        data, CHECKOUT, [("/amount", 950), ("/card/last4", "4242"), ("/notes", "fixed")]
    )
    assert corrected == {"amount": 950, "card": {"last4": "4242"}, "notes": "fixed"}
    assert data == {"amount": 900, "card": {"last4": "1111"}}
    assert [c.as_json() for c in changes] == [
        {"path": "/amount", "before": 900, "after": 950},
        {"path": "/card/last4", "before": "1111", "after": "4242"},
        {"path": "/notes", "after": "fixed"},
    ]


def test_undoing_two_corrections_newest_first_gives_the_data_as_accepted():
    accepted = {"amount": 900, "card": {"last4": "1111"}}
    once, first = correct_request_data(accepted, CHECKOUT, [("/amount", 950), ("/notes", "a")])
    twice, second = correct_request_data(once, CHECKOUT, [("/amount", 990), ("/notes", "b")])
    kept = [[c.as_json() for c in first], [c.as_json() for c in second]]

    assert data_before_corrections(twice, kept) == accepted
    assert data_before_corrections(twice, kept[1:]) == once
    assert data_before_corrections(twice, []) == twice
    assert twice == {"amount": 990, "card": {"last4": "1111"}, "notes": "b"}  # not mutated


@pytest.mark.parametrize(
    ("correction", "where"),
    [
        ([("/amount", 1), ("amount", 2)], ["/1/path"]),
        ([("", {})], ["/0/path"]),
        ([("/notes/-", 1)], ["/0/path"]),
        ([("/amount", 1), ("/card", {}), ("/card/last4", "x")], ["/2/path"]),
        ([("/amount/x", 1)], ["/0/path"]),
        ([("/notes", "a"), ("/amount", "many")], ["/1/value"]),
        ([("/card", {"last4": 4})], ["/0/value"]),
        ([("/amount", 2), ("/amout", 3)], ["/1/path"]),
        ([("/notes", "x" * 300_000)], ["/0/value"]),
        ([], [""]),
        ([("/notes", str(n)) for n in range(MAX_CORRECTION_PATHS + 1)], [""]),
    ],
)
def test_a_bad_correction_is_refused_with_problems_pointing_into_it(correction, where):
    with pytest.raises(DataValidationError) as refused:
        correct_request_data({"amount": 900}, CHECKOUT, correction)
    assert [p.path for p in refused.value.problems] == where


def test_a_nested_schema_problem_names_the_place_inside_the_value():
    with pytest.raises(DataValidationError) as refused:
        correct_request_data({"amount": 900}, CHECKOUT, [("/card", {"last4": 4})])
    (problem,) = refused.value.problems
    assert problem.message.startswith("/card/last4: 4 is not of type 'string'")
