"""Flow content that breaks evaluation: a 4xx with a path at publish, a failure code at run time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.worker.executor import Executor
from tests.integration.api_support import Api, decommission, problem, running_api
from tests.integration.worker_support import (
    execution,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)
from tests.security.security_support import store_unchecked

HUGE_INTEGER = int("9" * 400)
TABLE_LITERAL = "1" * 5_000  # past Python's 4,300-digit limit on reading an integer


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


# (data schema, path of the problem, data that made request creation answer 500)
BAD_SCHEMAS = {
    "recursive-ref": ({"$ref": "#"}, "/dataSchema/$ref", {}),
    "recursive-ref-in-allOf": (
        {"type": "object", "allOf": [{"$ref": "#"}]},
        "/dataSchema/allOf/0/$ref",
        {},
    ),
    "mutual-refs": (
        {
            "$ref": "#/$defs/a",
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}},
        },
        "/dataSchema/$defs/a/$ref",
        {},
    ),
    "invalid-pattern": (
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}},
        "/dataSchema/properties/x/pattern",
        {"x": "a"},
    ),
    "invalid-pattern-properties": (
        {"type": "object", "patternProperties": {"[a-": {"type": "string"}}},
        "/dataSchema/patternProperties/[a-",
        {"b": "a"},
    ),
    "huge-multiple-of": (
        {"type": "object", "properties": {"x": {"multipleOf": HUGE_INTEGER}}},
        "/dataSchema/properties/x/multipleOf",
        {"x": 1.5},
    ),
    "ref-to-a-non-schema": (
        {
            "type": "object",
            "properties": {"x": {"$ref": "#/properties/y/type"}, "y": {"type": "string"}},
        },
        "/dataSchema/properties/x/$ref",
        {"x": 1},
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_SCHEMAS))
def test_publishing_refuses_a_schema_that_cannot_be_evaluated(api: Api, name: str) -> None:
    schema, path, _ = BAD_SCHEMAS[name]

    response = api.post("/flows", decommission(dataSchema=schema))

    assert response.status_code == 422, response.get_data(as_text=True)
    body = problem(response)
    assert body["code"] == "FLOW_INVALID"
    assert path in [p["path"] for p in body["problems"]]


@pytest.mark.parametrize("name", sorted(BAD_SCHEMAS))
def test_creating_a_request_on_a_stored_flow_with_such_a_schema_is_a_4xx(
    api: Api, runtime_engine: Engine, name: str
) -> None:
    schema, path, data = BAD_SCHEMAS[name]
    flow_id = store_unchecked(runtime_engine, dataSchema=schema)

    response = api.post("/requests", {"flowId": flow_id, "data": data})

    assert response.status_code == 422, response.get_data(as_text=True)
    body = problem(response)
    assert body["code"] == "DATA_SCHEMA_INVALID"
    assert path in [p["path"] for p in body["problems"]]


def _table(cell: str) -> dict[str, Any]:
    return {
        "hitPolicy": "FIRST",
        "inputs": ["/data/n"],
        "rules": [
            {"id": "big", "when": [cell], "then": {"to": "off"}},
            {"id": "other", "when": ["-"], "then": {"to": "attention"}},
        ],
    }


@pytest.mark.parametrize("cell", [TABLE_LITERAL, f"> {TABLE_LITERAL}", f"[0..{TABLE_LITERAL}]"])
def test_publishing_refuses_a_table_literal_with_too_many_digits(api: Api, cell: str) -> None:
    definition = decommission()
    definition["transitions"][0]["decision"] = _table(cell)

    response = api.post("/flows", definition)

    assert response.status_code == 422, response.get_data(as_text=True)
    paths = [p["path"] for p in problem(response)["problems"]]
    assert paths == ["/transitions/0/decision/rules/0/when/0"]


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("dataSchema", "maximum"), 1e101),
        (("transitions", 0, "actions", 0, "input", "command", "const"), -(10**120)),
        (("transitions", 0, "decision", "rules", 0, "then", "cost"), 2e300),
    ],
)
def test_publishing_refuses_numbers_beyond_1e100(
    api: Api, where: tuple[Any, ...], value: Any
) -> None:
    definition = decommission()
    parent = definition
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value

    response = api.post("/flows", definition)

    assert response.status_code == 422, response.get_data(as_text=True)
    path = "/" + "/".join(str(step) for step in where)
    assert path in [p["path"] for p in problem(response)["problems"]]


def test_a_stored_table_literal_with_too_many_digits_fails_the_execution_cleanly(
    runtime_engine: Engine,
) -> None:
    definition = flow_definition(
        [],
        decision={
            **_table(TABLE_LITERAL),
            "rules": [
                {"id": "big", "when": [TABLE_LITERAL], "then": {"to": "done"}},
                {"id": "other", "when": ["-"], "then": {"to": "attention"}},
            ],
        },
    )
    execution_id = start_execution(runtime_engine, definition, {"n": 1})

    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "FAILED"
    assert execution(runtime_engine, execution_id).error_code == "INVALID_TABLE"


@pytest.mark.parametrize("name", ["recursive-ref", "invalid-pattern", "huge-multiple-of"])
def test_a_stored_schema_that_cannot_be_evaluated_fails_the_execution_cleanly(
    runtime_engine: Engine, name: str
) -> None:
    """A flow stored before a check existed: the finish that writes new data checks it
    against that schema, and fails cleanly instead of crashing or hanging."""
    schema, _, data = BAD_SCHEMAS[name]
    seen = [{"path": "/seen", "const": True}]
    definition = flow_definition([], data_schema=schema, updates=seen)
    execution_id = start_execution(runtime_engine, definition, data)

    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "FAILED"
    assert execution(runtime_engine, execution_id).error_code == "DATA_SCHEMA_INVALID"


@pytest.mark.parametrize("name", ["recursive-ref", "invalid-pattern", "huge-multiple-of"])
def test_a_finish_that_updates_nothing_never_evaluates_the_stored_schema(
    runtime_engine: Engine, name: str
) -> None:
    """Data no update touches is the data as it was checked when it was written: the
    finish keeps it as it is and evaluates nothing."""
    schema, _, data = BAD_SCHEMAS[name]
    execution_id = start_execution(runtime_engine, flow_definition([], data_schema=schema), data)

    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "SUCCEEDED"
    assert execution(runtime_engine, execution_id).error_code is None
    request = request_row(runtime_engine, execution(runtime_engine, execution_id).request_id)
    assert (request.state, request.busy_execution_id, request.data) == ("done", None, data)
