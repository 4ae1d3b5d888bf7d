"""No flow content makes one request cost more than a bounded time: sizes first, linear checks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from orquestador.domain.canonical import canonical_json
from orquestador.domain.decision import check_table
from orquestador.domain.errors import DataValidationError
from orquestador.domain.limits import MAX_DATA_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from tests.integration.api_support import Api, decommission, problem, running_api

# Each case took minutes, or would take longer than the age of the universe, before;
# the bound leaves room for a slow machine.
FAST = 10.0


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _timed(call: Any, *args: Any) -> tuple[Any, float]:
    """The call's answer and the CPU seconds this thread spent on it. The test client
    runs the request in this thread; CPU time, unlike the clock, does not grow when the
    machine is busy with other work, so the bound tells a runaway cost from a slow day."""
    started = time.thread_time()
    result = call(*args)
    return result, time.thread_time() - started


def _publish_schema(api: Api, schema: dict[str, Any]) -> str:
    response = api.post("/flows", decommission(dataSchema=schema))
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["id"]


@pytest.mark.timeout(60)
def test_unique_items_over_20000_objects_is_checked_in_linear_time(api: Api) -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "uniqueItems": True}}}
    flow_id = _publish_schema(api, schema)
    items = [{"n": n} for n in range(20_000)]
    assert len(canonical_json({"items": items})) < MAX_DATA_BYTES

    created, seconds = _timed(api.post, "/requests", {"flowId": flow_id, "data": {"items": items}})
    assert created.status_code == 201, created.get_data(as_text=True)
    duplicated, more_seconds = _timed(
        api.post, "/requests", {"flowId": flow_id, "data": {"items": [*items[:-1], {"n": 0.0}]}}
    )

    assert duplicated.status_code == 422
    assert [p["path"] for p in problem(duplicated)["problems"]] == ["/data/items"]
    assert seconds + more_seconds < FAST


@pytest.mark.timeout(60)
def test_data_over_the_size_limit_is_refused_before_it_is_validated(api: Api) -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}
        },
    }
    flow_id = _publish_schema(api, schema)
    items = [{"n": n} for n in range(30_000)]  # about 330 KiB, every item of the wrong type

    response, seconds = _timed(api.post, "/requests", {"flowId": flow_id, "data": {"items": items}})

    assert response.status_code == 422
    problems = problem(response)["problems"]
    assert len(problems) == 1
    assert problems[0]["path"] == "/data"
    assert f"the limit is {MAX_DATA_BYTES}" in problems[0]["message"]
    assert seconds < FAST


# Patterns that backtrack exponentially in a backtracking engine, against a text they fail on.
BACKTRACKING = "^(a+)+$"
VICTIM = "a" * 40 + "!"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("schema", "data", "status"),
    [
        ({"properties": {"x": {"type": "string", "pattern": BACKTRACKING}}}, {"x": VICTIM}, 422),
        ({"patternProperties": {BACKTRACKING: {"type": "string"}}}, {VICTIM: 1}, 201),
        (
            {"patternProperties": {BACKTRACKING: True}, "additionalProperties": False},
            {VICTIM: 1},
            422,
        ),
        # A value that claims to be a regex is one this server could run.
        ({"properties": {"x": {"format": "regex"}}}, {"x": "(?<=a)b"}, 422),
    ],
    ids=["pattern", "patternProperties", "additionalProperties", "format-regex"],
)
def test_patterns_run_in_linear_time(
    api: Api, schema: dict[str, Any], data: Any, status: int
) -> None:
    flow_id = _publish_schema(api, {"type": "object", **schema})

    response, seconds = _timed(api.post, "/requests", {"flowId": flow_id, "data": data})

    assert response.status_code == status, response.get_data(as_text=True)
    assert seconds < FAST


@pytest.mark.timeout(60)
def test_alternatives_that_multiply_with_depth_stop_at_the_step_budget() -> None:
    # Both branches descend into "a" and both fail at the bottom: 2**40 evaluations.
    branch = {"properties": {"a": {"$ref": "#"}}, "required": ["b"]}
    schema = {"anyOf": [branch, {**branch, "required": ["c"]}]}
    data: dict[str, Any] = {}
    deepest = data
    for _ in range(40):
        deepest["a"] = {}
        deepest = deepest["a"]

    started = time.thread_time()
    with pytest.raises(DataValidationError) as caught:
        validate_request_data(data, schema)

    assert time.thread_time() - started < FAST
    assert [p.path for p in caught.value.problems] == [""]
    assert "takes more than" in caught.value.problems[0].message


@pytest.mark.timeout(60)
def test_a_table_of_8000_rules_is_refused_quickly(api: Api) -> None:
    definition = decommission()
    definition["transitions"][0]["decision"] = {
        "hitPolicy": "UNIQUE",
        "inputs": ["/actions/wait/status"],
        "rules": [{"id": f"r{n}", "when": [f'"{n}"'], "then": {"to": "off"}} for n in range(8_000)],
    }

    response, seconds = _timed(api.post, "/flows", definition)

    assert response.status_code == 422
    paths = [p["path"] for p in problem(response)["problems"]]
    assert paths == ["/transitions/0/decision/rules"]
    assert seconds < FAST


def _worst_case_table(policy: str, rules: int = 1_000, inputs: int = 32) -> dict[str, Any]:
    # Every pair of rules agrees on every column but the last, which is what makes a
    # rule-by-rule comparison look at every cell of every pair.
    return {
        "hitPolicy": policy,
        "inputs": [f"/data/c{c}" for c in range(inputs)],
        "rules": [
            {
                "id": f"r{r}",
                "when": ["-"] * (inputs - 1) + [str(r)],
                "then": {"to": "done"},
            }
            for r in range(rules)
        ],
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["UNIQUE", "FIRST"])
def test_the_static_checks_of_the_largest_table_allowed_are_fast(policy: str) -> None:
    table = _worst_case_table(policy)

    (errors, warnings), seconds = _timed(check_table, table)

    assert (errors, warnings) == ([], [])
    assert seconds < 2.0


@pytest.mark.timeout(60)
def test_a_definition_with_thousands_of_problems_is_checked_in_linear_time(api: Api) -> None:
    # Each part of a definition asks whether the schema found a problem under it;
    # that question used to scan every problem found, for every part.
    definition = decommission()
    definition["transitions"] = [{"id": f"t{n}", "from": [n], "to": "new"} for n in range(15_000)]

    response, seconds = _timed(api.post, "/flows", definition)

    assert response.status_code == 422
    assert len(problem(response)["problems"]) > 15_000
    assert seconds < FAST
