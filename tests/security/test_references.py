"""$ref in flow content reaches no network and no file: refused at publish, unresolvable after."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.domain.errors import DataSchemaError
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.worker.caches import SchemaCache
from tests.integration.api_support import Api, decommission, problem, running_api
from tests.security.security_support import Listener, store_unchecked

SECRET = "s3cret-f1le-c0ntent-7d1e"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as listener:
        yield listener


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    """A local JSON document whose content a reference could echo: a file:// URL to it."""
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"enum": [SECRET], "$defs": {"value": {"const": SECRET}}}))
    return path.as_uri()


def _schema_with(where: str, reference: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A data schema holding ``reference`` at one of the places a schema can sit, and its path."""
    places = {
        "property": ({"type": "object", "properties": {"x": reference}}, "/properties/x"),
        "items": (
            {"type": "object", "properties": {"x": {"items": reference}}},
            "/properties/x/items",
        ),
        "allOf": ({"type": "object", "allOf": [reference]}, "/allOf/0"),
        "defs": (
            {
                "type": "object",
                "$defs": {"d": reference},
                "properties": {"x": {"$ref": "#/$defs/d"}},
            },
            "/$defs/d",
        ),
    }
    schema, path = places[where]
    return schema, path


@pytest.mark.parametrize("where", ["property", "items", "allOf", "defs"])
@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef"])
def test_publishing_refuses_a_remote_reference_at_its_path_and_connects_nowhere(
    api: Api, listener: Listener, where: str, keyword: str
) -> None:
    schema, path = _schema_with(where, {keyword: listener.url()})

    response = api.post("/flows", decommission(dataSchema=schema))

    assert response.status_code == 422, response.get_data(as_text=True)
    paths = [p["path"] for p in problem(response)["problems"]]
    assert f"/dataSchema{path}/{keyword}" in paths
    assert listener.heard() == []


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "/dataSchema/$schema"),
        ({"properties": {"x": {"$id": "http://127.0.0.1:9/x"}}}, "/dataSchema/properties/x/$id"),
        ({"properties": {"x": {"$ref": "other.json#/a"}}}, "/dataSchema/properties/x/$ref"),
        ({"properties": {"x": {"$ref": "#name"}}}, "/dataSchema/properties/x/$ref"),
    ],
)
def test_publishing_refuses_every_reference_that_is_not_local(
    api: Api, schema: dict[str, Any], path: str
) -> None:
    response = api.post("/flows", decommission(dataSchema=schema))

    assert response.status_code == 422, response.get_data(as_text=True)
    assert path in [p["path"] for p in problem(response)["problems"]]


def test_a_file_reference_is_refused_and_its_content_never_answered(
    api: Api, secret_file: str
) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": secret_file}}}

    response = api.post("/flows", decommission(dataSchema=schema))

    assert response.status_code == 422
    assert [p["path"] for p in problem(response)["problems"]] == ["/dataSchema/properties/x/$ref"]
    assert SECRET not in response.get_data(as_text=True)


def test_a_stored_flow_with_outside_references_cannot_make_request_creation_connect_or_read(
    api: Api, runtime_engine: Engine, listener: Listener, secret_file: str
) -> None:
    # Stored as a flow published before publishing checked references would be.
    schema = {
        "type": "object",
        "properties": {
            "file": {"$ref": secret_file},
            "defs": {"$ref": secret_file + "#/$defs/value"},
            "net": {"$ref": listener.url()},
        },
    }
    flow_id = store_unchecked(runtime_engine, dataSchema=schema)

    bodies = [
        {"file": "guess"},
        {"defs": "guess"},
        {"net": "anything"},
        {"file": "guess", "defs": "guess", "net": 1},
    ]
    for data in bodies:
        response = api.post("/requests", {"flowId": flow_id, "data": data})
        assert response.status_code == 422, response.get_data(as_text=True)
        body = problem(response)
        assert body["code"] == "DATA_SCHEMA_INVALID"
        assert SECRET not in response.get_data(as_text=True)
        assert "/dataSchema/properties/net/$ref" in [p["path"] for p in body["problems"]]
    assert listener.heard() == []


def test_an_unresolvable_local_reference_is_reported_at_the_reference(api: Api) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}

    response = api.post("/flows", decommission(dataSchema=schema))

    assert response.status_code == 422
    assert [p["path"] for p in problem(response)["problems"]] == ["/dataSchema/properties/x/$ref"]


def test_a_stored_unresolvable_reference_is_reported_in_the_flow_not_in_the_data(
    api: Api, runtime_engine: Engine
) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}
    flow_id = store_unchecked(runtime_engine, dataSchema=schema)

    response = api.post("/requests", {"flowId": flow_id, "data": {"x": 1}})

    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "DATA_SCHEMA_INVALID"
    assert [p["path"] for p in body["problems"]] == ["/dataSchema/properties/x/$ref"]


def test_the_worker_check_of_request_data_connects_nowhere(listener: Listener) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": listener.url()}}}

    with pytest.raises(DataSchemaError):
        validate_request_data({"x": 1}, schema)

    assert listener.heard() == []


def test_adapter_schemas_are_validated_without_retrieving_anything(listener: Listener) -> None:
    adapter = SimpleNamespace(
        capability="test.refs",
        version=1,
        input_schema={"type": "object", "properties": {"x": {"$ref": listener.url()}}},
        output_schema={"type": "object", "additionalProperties": {"$ref": listener.url("out")}},
    )
    cache = SchemaCache()

    for which, value in (("input", {"x": 1}), ("output", {"y": 2})):
        # An unresolvable reference in an adapter's own schema may raise; only the
        # network matters here.
        with contextlib.suppress(Exception):
            cache.problems(adapter, which, value)  # type: ignore[arg-type]

    assert listener.heard() == []
