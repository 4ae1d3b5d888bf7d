"""Fuzzing plans, events and dry runs with their scopes: never a 5xx, answers as documented."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.openapi.automation import paths
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from tests.acceptance.fuzzing import MAX_EXAMPLES, schemas_by_mode
from tests.db_support import TestDatabase

SCOPES = ["flows:admin", "plans:admin", "events:write", "requests:read"]

PROVISIONED = {
    "key": "fuzzed-provisioned",
    "trigger": "provisioned",
    "start": "go",
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "go", "from": ["new"], "to": "done"}],
}
OPERATIONS = sorted(
    operation["operationId"] for operations in paths().values() for operation in operations.values()
)


class _KnowsNothing:
    def knows(self, capability: str, version: int) -> bool:
        return False


# One database and one app for the module: whatever a fuzzed call left, the next must still
# answer without a server error, so the tests share their setup.
@pytest.fixture(scope="module")
def fuzz_app(module_database: TestDatabase) -> Iterator[Flask]:
    app = create_app(
        Settings.from_env(
            {},
            database_url=module_database.runtime_dsn,
            request_api_enabled=True,
            flow_admin_enabled=True,
            jwt_secret="fuzz-signing-secret-" + "0123456789abcdef" * 3,
        ),
        registry=_KnowsNothing(),
    )
    try:
        yield app
    finally:
        app.extensions[EXTENSION_KEY].engine.dispose()


@pytest.fixture(scope="module")
def fuzz_schemas(fuzz_app: Flask) -> dict[GenerationMode, Any]:
    return schemas_by_mode(fuzz_app)


@pytest.fixture(scope="module")
def authorization(fuzz_app: Flask) -> dict[str, str]:
    token = mint_token(
        fuzz_app.extensions[EXTENSION_KEY].settings, sub="fuzzer", org="org-fuzz", scopes=SCOPES
    )
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def real_ids(fuzz_app: Flask, authorization: dict[str, str]) -> dict[str, str]:
    """A bound plan, so fuzzed ids and events sometimes reach the binding and starting paths."""
    client = fuzz_app.test_client()
    flow_id = client.post("/api/v1/flows", json=PROVISIONED, headers=authorization).get_json()["id"]
    client.put("/api/v1/plans/vps", json={"name": "VPS"}, headers=authorization)
    client.put(
        "/api/v1/plans/vps/bindings/provisioned", json={"flowId": flow_id}, headers=authorization
    )
    return {"flowId": flow_id, "planId": "vps", "moment": "provisioned"}


def _point_at_real_rows(case: schemathesis.Case, ids: dict[str, str]) -> None:
    for name in list(case.path_parameters or {}):
        if name in ids:
            case.path_parameters[name] = ids[name]
    if isinstance(case.body, dict):
        for name in ("flowId", "planId", "moment"):
            if name in case.body:
                case.body[name] = ids[name]
        if "transition" in case.body:
            case.body["transition"] = "go"


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("operation_id", OPERATIONS)
def test_no_automation_operation_answers_with_a_server_error(
    fuzz_schemas: dict[GenerationMode, Any],
    authorization: dict[str, str],
    real_ids: dict[str, str],
    operation_id: str,
    mode: GenerationMode,
) -> None:
    schema = fuzz_schemas[mode]
    operation = schema.find_operation_by_id(operation_id)
    checks: list[Any] = [not_a_server_error]
    if mode is GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)

    @given(case=operation.as_strategy(mode), use_real_ids=st.booleans())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: schemathesis.Case, use_real_ids: bool) -> None:
        if use_real_ids:
            _point_at_real_rows(case, real_ids)
        case.call_and_validate(headers=authorization, checks=checks)

    call()
