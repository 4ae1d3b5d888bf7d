"""Property-based fuzzing of every documented operation: whatever the input, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.openapi import openapi_document
from orquestador.api.tokens import mint_token
from orquestador.config import Settings

MAX_EXAMPLES = 30
SCOPES = ["flows:admin", "requests:read", "requests:write", "requests:read-all"]

FLOW = {
    "key": "fuzzed",
    "trigger": "manual",
    "dataSchema": {"type": "object", "properties": {"note": {"type": "string"}}},
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [
        {"id": "finish", "from": ["new"], "actions": [], "to": "done"},
        {"id": "reopen", "from": ["done"], "actions": [], "to": "new"},
    ],
}


class _KnowsBuiltins:
    def knows(self, capability: str, version: int) -> bool:
        return version == 1 and capability in {"machine.command", "machine.wait", "notify"}


@pytest.fixture
def fuzz_settings(database) -> Settings:
    return Settings.from_env(
        {},
        database_url=database.runtime_dsn,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret="fuzz-signing-secret-" + "0123456789abcdef" * 3,
    )


@pytest.fixture
def fuzz_app(fuzz_settings: Settings) -> Iterator[Flask]:
    app = create_app(fuzz_settings, registry=_KnowsBuiltins())
    try:
        yield app
    finally:
        app.extensions[EXTENSION_KEY].engine.dispose()


@pytest.fixture
def authorization(fuzz_settings: Settings) -> dict[str, str]:
    token = mint_token(fuzz_settings, sub="fuzzer", org="org-fuzz", scopes=SCOPES)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def real_ids(fuzz_app: Flask, authorization: dict[str, str]) -> dict[str, str]:
    """A flow, a request and an execution, so fuzzed ids sometimes hit real rows."""
    client = fuzz_app.test_client()
    flow_id = client.post("/api/v1/flows", json=FLOW, headers=authorization).get_json()["id"]
    body = {"flowId": flow_id, "data": {"note": "seed"}}
    request_id = client.post("/api/v1/requests", json=body, headers=authorization).get_json()["id"]
    accepted = client.post(
        f"/api/v1/requests/{request_id}/transitions",
        json={"transition": "finish", "expectedRevision": 1},
        headers=authorization,
    )
    execution_id = accepted.get_json()["executionId"]
    # A second request stays idle, so fuzzed transitions can reach the acceptance path.
    idle = client.post("/api/v1/requests", json=body, headers=authorization).get_json()["id"]
    return {"flowId": flow_id, "requestId": idle, "executionId": execution_id}


def _point_at_real_rows(case: schemathesis.Case, ids: dict[str, str]) -> None:
    for name in list(case.path_parameters or {}):
        if name in ids:
            case.path_parameters[name] = ids[name]
    if isinstance(case.body, dict) and "flowId" in case.body:
        case.body["flowId"] = ids["flowId"]
    if isinstance(case.body, dict) and "transition" in case.body:
        case.body["transition"] = "finish"


# Negative generation needs an input to break, so operations without one run positive only.
CASES = sorted(
    (operation["operationId"], mode)
    for operations in openapi_document()["paths"].values()
    for operation in operations.values()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or "requestBody" in operation or "parameters" in operation
)


# Driven by hand rather than through schemathesis' pytest plugin, whose lazy fixture
# loader does not run under the pytest version we use.
@pytest.mark.parametrize(("operation_id", "mode"), CASES, ids=lambda value: str(value))
def test_no_operation_answers_with_a_server_error(
    fuzz_app: Flask,
    authorization: dict[str, str],
    real_ids: dict[str, str],
    operation_id: str,
    mode: GenerationMode,
) -> None:
    # Positive cases leave out NUL characters so they get past the body checks and
    # reach the database; negative cases keep them to probe those checks.
    config = schemathesis.Config.from_dict(
        {"generation": {"allow-x00": mode is GenerationMode.NEGATIVE}}
    )
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", fuzz_app, config=config)
    operation = schema.find_operation_by_id(operation_id)

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
        case.call_and_validate(headers=authorization, checks=[not_a_server_error])

    call()


def test_every_operation_is_fuzzed() -> None:
    fuzzed: set[Any] = {operation_id for operation_id, _ in CASES}
    documented = {
        operation["operationId"]
        for operations in openapi_document()["paths"].values()
        for operation in operations.values()
    }
    assert fuzzed == documented
