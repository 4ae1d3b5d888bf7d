"""Every limit on flow content is enforced, and published where clients read it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orquestador.api.openapi.document import openapi_document
from orquestador.domain import limits
from orquestador.domain.flow_definition import definition_schema
from tests.integration.api_support import Api, decommission, problem, running_api

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _at(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """Follow properties and local $refs of the definition schema."""
    node = schema
    for name in path:
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
        node = (
            node["properties"][name]
            if name not in ("items", "*")
            else (node["items"] if name == "items" else node["additionalProperties"])
        )
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


TRANSITION = ("transitions", "items")
ACTION = (*TRANSITION, "actions", "items")
TABLE = (*TRANSITION, "decision")
RULE = (*TABLE, "rules", "items")

# (path in the definition schema, keyword, the limit it must state)
SCHEMA_LIMITS = [
    (("states",), "maxItems", limits.MAX_STATES),
    (("transitions",), "maxItems", limits.MAX_TRANSITIONS),
    ((*TRANSITION, "from"), "maxItems", limits.MAX_STATES),
    ((*TRANSITION, "actions"), "maxItems", limits.MAX_ACTIONS),
    ((*TRANSITION, "updates"), "maxItems", limits.MAX_UPDATES),
    ((*TRANSITION, "updates", "items", "path"), "maxLength", limits.MAX_POINTER_CHARS),
    ((*ACTION, "input"), "maxProperties", limits.MAX_INPUT_FIELDS),
    ((*TABLE, "rules"), "maxItems", limits.MAX_RULES),
    ((*TABLE, "inputs"), "maxItems", limits.MAX_INPUTS),
    ((*TABLE, "inputs", "items"), "maxLength", limits.MAX_POINTER_CHARS),
    ((*TABLE, "outputValues"), "maxProperties", limits.MAX_RANKED_OUTPUTS),
    ((*TABLE, "outputValues", "*"), "maxItems", limits.MAX_RANKED_VALUES),
    ((*RULE, "when"), "maxItems", limits.MAX_INPUTS),
    ((*RULE, "when", "items"), "maxLength", limits.MAX_CELL_CHARS),
    ((*RULE, "then"), "maxProperties", limits.MAX_OUTPUT_NAMES),
    (("title",), "maxLength", limits.MAX_TITLE_CHARS),
    (("description",), "maxLength", limits.MAX_DESCRIPTION_CHARS),
]


@pytest.mark.parametrize(("path", "keyword", "limit"), SCHEMA_LIMITS)
def test_the_definition_schema_states_the_limits_the_server_enforces(
    path: tuple[str, ...], keyword: str, limit: int
) -> None:
    assert _at(definition_schema(), *path)[keyword] == limit


def test_the_definition_schema_bounds_every_number() -> None:
    bounded = definition_schema()["$defs"]["boundedNumbers"]
    assert (bounded["exclusiveMinimum"], bounded["exclusiveMaximum"]) == (
        -limits.MAX_NUMBER,
        limits.MAX_NUMBER,
    )
    assert {"$ref": "#/$defs/boundedNumbers"} in definition_schema()["allOf"]


def test_the_openapi_document_carries_the_same_limits() -> None:
    components = openapi_document()["components"]["schemas"]
    text = repr(components)
    for _, keyword, limit in SCHEMA_LIMITS:
        assert f"'{keyword}': {limit}" in text


def test_flows_md_lists_every_limit() -> None:
    text = (ROOT / "docs" / "FLOWS.md").read_text()
    section = text[text.index("\n## Limits") :]
    section = section[: section.find("\n## ", 1)]
    numbers = {int(n.replace(",", "")) for n in re.findall(r"\b\d[\d,]*\b", section)}
    published = [
        limits.MAX_DATA_BYTES // 1024,
        limits.MAX_DATA_DEPTH,
        limits.MAX_SCHEMA_BYTES // 1024,
        limits.MAX_SCHEMA_DEPTH,
        limits.MAX_SCHEMA_CHAIN,
        limits.MAX_PATTERN_CHARS,
        limits.MAX_VALIDATION_STEPS,
        limits.MAX_NUMBER_DIGITS,
        limits.MAX_RULES,
        limits.MAX_INPUTS,
        limits.MAX_CELL_CHARS,
        limits.MAX_OUTPUT_NAMES,
        limits.MAX_RANKED_OUTPUTS,
        limits.MAX_RANKED_VALUES,
        limits.MAX_STATES,
        limits.MAX_TRANSITIONS,
        limits.MAX_ACTIONS,
        limits.MAX_UPDATES,
        limits.MAX_INPUT_FIELDS,
        limits.MAX_POINTER_CHARS,
        limits.MAX_TITLE_CHARS,
        limits.MAX_DESCRIPTION_CHARS,
    ]
    assert [n for n in published if n not in numbers] == []


def _too_many(name: str) -> tuple[dict[str, Any], str]:
    definition = decommission()
    transition = definition["transitions"][0]
    if name == "states":
        definition["states"] = [f"s{n}" for n in range(limits.MAX_STATES + 1)]
        return definition, "/states"
    if name == "rules":
        rule = transition["decision"]["rules"][1]
        transition["decision"]["rules"] = [
            {**rule, "id": f"r{n}"} for n in range(limits.MAX_RULES + 1)
        ]
        return definition, "/transitions/0/decision/rules"
    if name == "inputs":
        decision = transition["decision"]
        decision["inputs"] = ["/data/x"] * (limits.MAX_INPUTS + 1)
        for rule in decision["rules"]:
            rule["when"] = ["-"] * (limits.MAX_INPUTS + 1)
        return definition, "/transitions/0/decision/inputs"
    if name == "cell":
        transition["decision"]["rules"][0]["when"] = ['"' + "x" * limits.MAX_CELL_CHARS + '"']
        return definition, "/transitions/0/decision/rules/0/when/0"
    if name == "schema-bytes":
        properties = {f"p{n}": {"type": "string"} for n in range(limits.MAX_SCHEMA_BYTES // 20)}
        definition["dataSchema"] = {"type": "object", "properties": properties}
        return definition, "/dataSchema"
    if name == "schema-depth":
        schema: dict[str, Any] = {"type": "object"}
        for _ in range(limits.MAX_SCHEMA_DEPTH // 2 + 1):
            schema = {"type": "object", "properties": {"x": schema}}
        definition["dataSchema"] = schema
        return definition, "/dataSchema/" + "/".join(["properties", "x"] * 16)
    if name == "schema-chain":
        chain = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(limits.MAX_SCHEMA_CHAIN)}
        definition["dataSchema"] = {"$ref": "#/$defs/d0", "$defs": {**chain, "last": {}}}
        chain[f"d{limits.MAX_SCHEMA_CHAIN - 1}"]["$ref"] = "#/$defs/last"
        return definition, "/dataSchema"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    ["states", "rules", "inputs", "cell", "schema-bytes", "schema-depth", "schema-chain"],
)
def test_publishing_past_a_limit_is_refused_at_its_path(api: Api, name: str) -> None:
    definition, path = _too_many(name)

    response = api.post("/flows", definition)

    assert response.status_code == 422, response.get_data(as_text=True)
    assert path in [p["path"] for p in problem(response)["problems"]]
