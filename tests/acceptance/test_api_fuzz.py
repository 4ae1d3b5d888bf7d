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
from schemathesis.checks import not_a_server_error, response_schema_conformance
from sqlalchemy import Engine, text

from orquestador.actions import Adapter, AdapterRegistry, Effect
from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.api.openapi.document import openapi_document
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.db.engine import make_engine
from tests.acceptance.fuzzing import MAX_EXAMPLES, schemas_by_mode
from tests.db_support import TestDatabase

SCOPES = [
    "flows:admin",
    "requests:read",
    "requests:write",
    "requests:read-all",
    "executions:reconcile",
    "executions:cancel",
    "plans:admin",
    "events:write",
    "notices:read",
    "org:admin",
    "machines:admin",
]

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

# A flow with one write, so an execution can be parked for fuzzed decisions.
WRITE_FLOW = {
    "key": "fuzzed-write",
    "trigger": "manual",
    "initialState": "new",
    "states": ["new", "done", "attention"],
    "transitions": [
        {
            "id": "send",
            "from": ["new"],
            "actions": [
                {
                    "id": "send",
                    "capability": "machine.command",
                    "version": 1,
                    "input": {"command": {"const": "poweroff"}},
                    "onError": "attention",
                }
            ],
            "to": "done",
        }
    ],
}


class _KnowsBuiltins:
    def knows(self, capability: str, version: int) -> bool:
        return version == 1 and capability in {"machine.command", "machine.wait", "notify"}


# One database and one app for the module: whatever a fuzzed call left, the next must still
# answer without a server error, so the tests share their setup.
@pytest.fixture(scope="module")
def fuzz_settings(module_database: TestDatabase) -> Settings:
    return Settings.from_env(
        {},
        database_url=module_database.runtime_dsn,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret="fuzz-signing-secret-" + "0123456789abcdef" * 3,
    )


def _output_checker() -> AdapterRegistry:
    """The contract a confirmed output of the parked write is checked against."""
    registry = AdapterRegistry()
    registry.add(
        Adapter(
            capability="machine.command",
            version=1,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={
                "type": "object",
                "required": ["commandId"],
                "properties": {"commandId": {"type": "string", "maxLength": 40}},
            },
            timeout_seconds=5,
            max_attempts=1,
            invoke=lambda ctx: {},
        )
    )
    return registry


@pytest.fixture(scope="module")
def fuzz_app(fuzz_settings: Settings) -> Iterator[Flask]:
    app = create_app(fuzz_settings, registry=_KnowsBuiltins())
    app.extensions[ADAPTERS_EXTENSION] = _output_checker()
    try:
        yield app
    finally:
        app.extensions[EXTENSION_KEY].engine.dispose()


@pytest.fixture(scope="module")
def fuzz_schemas(fuzz_app: Flask) -> dict[GenerationMode, Any]:
    return schemas_by_mode(fuzz_app)


@pytest.fixture(scope="module")
def authorization(fuzz_settings: Settings) -> dict[str, str]:
    token = mint_token(fuzz_settings, sub="fuzzer", org="org-fuzz", scopes=SCOPES)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def agent_authorization(fuzz_settings: Settings) -> dict[str, str]:
    """A machine agent's token: the agent routes answer nothing else but 403."""
    token = mint_token(fuzz_settings, sub="machine:m-fuzz", org="org-fuzz", scopes=["agent"])
    return {"Authorization": f"Bearer {token}"}


def _accept(client: Any, authorization: dict[str, str], flow: dict[str, Any], name: str) -> str:
    flow_id = client.post("/api/v1/flows", json=flow, headers=authorization).get_json()["id"]
    body = {"flowId": flow_id, "data": {"note": "seed"}}
    request_id = client.post("/api/v1/requests", json=body, headers=authorization).get_json()["id"]
    accepted = client.post(
        f"/api/v1/requests/{request_id}/transitions",
        json={"transition": name, "expectedRevision": 1},
        headers=authorization,
    )
    return accepted.get_json()["executionId"]


def _park(owner_engine: Engine, execution_id: str) -> None:
    """What a worker leaves after an uncertain write: the step in doubt, the request busy."""
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability,"
                " adapter_version, error_code)"
                " VALUES (:id, 'send', 'UNKNOWN', 1, 1, 'hash', :key, 'NON_IDEMPOTENT_WRITE',"
                " 'machine.command', 1, 'UNCERTAIN')"
            ),
            {"id": execution_id, "key": f"{execution_id}:send"},
        )
        connection.execute(
            text(
                "UPDATE execution SET status = 'RECONCILIATION_REQUIRED',"
                " error_code = 'UNCERTAIN_OUTCOME', attempts = 1 WHERE id = :id"
            ),
            {"id": execution_id},
        )


@pytest.fixture(scope="module")
def real_ids(
    fuzz_app: Flask, authorization: dict[str, str], module_database: TestDatabase
) -> Iterator[dict[str, str]]:
    """A flow, requests and executions (one parked), so fuzzed ids sometimes hit real rows."""
    owner_engine = make_engine(module_database.owner_dsn)
    try:
        yield _arrange_real_rows(fuzz_app, authorization, owner_engine)
    finally:
        owner_engine.dispose()


def _arrange_real_rows(
    fuzz_app: Flask, authorization: dict[str, str], owner_engine: Engine
) -> dict[str, str]:
    client = fuzz_app.test_client()
    execution_id = _accept(client, authorization, FLOW, "finish")
    parked = _accept(client, authorization, WRITE_FLOW, "send")
    _park(owner_engine, parked)
    flow_id = client.get(f"/api/v1/executions/{execution_id}", headers=authorization).get_json()[
        "flowId"
    ]
    # A second request stays idle, so fuzzed transitions can reach the acceptance path.
    body = {"flowId": flow_id, "data": {"note": "seed"}}
    idle = client.post("/api/v1/requests", json=body, headers=authorization).get_json()["id"]
    # An enrolled machine, so fuzzed revocations sometimes revoke something.
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO machine_credential (id, org_id, machine_id, issued_at, expires_at,"
                " issued_by) VALUES ('fuzzed', 'org-fuzz', 'm-fuzz', now(),"
                " now() + interval '1 day', 'cli:fuzz')"
            )
        )
    return {
        "flowId": flow_id,
        "requestId": idle,
        "executionId": execution_id,
        "parkedExecutionId": parked,
        "machineId": "m-fuzz",
    }


def _point_at_real_rows(case: schemathesis.Case, ids: dict[str, str]) -> None:
    deciding = case.operation.path.endswith(("/reconciliation", "/evidence"))
    for name in list(case.path_parameters or {}):
        if name == "executionId" and deciding:
            case.path_parameters[name] = ids["parkedExecutionId"]
        elif name in ids:
            case.path_parameters[name] = ids[name]
    for name in ("flowId", "requestId"):
        if isinstance(case.query, dict) and name in case.query:
            case.query[name] = ids[name]
    if isinstance(case.body, dict) and "flowId" in case.body:
        case.body["flowId"] = ids["flowId"]
    if isinstance(case.body, dict) and "flow" in case.body:
        # A run names its flow by key or id: either reaches a real flow.
        case.body["flow"] = "fuzzed" if case.body["flow"] else ids["flowId"]
    if isinstance(case.body, dict) and "transition" in case.body:
        case.body["transition"] = "finish"
    if isinstance(case.body, dict) and "actionId" in case.body:
        case.body["actionId"] = "send"


def _short_wait(value: Any) -> Any:
    """A valid wait becomes 0 seconds; anything else is kept to be refused."""
    try:
        return 0 if 0 <= float(value) <= 30 else value
    except (TypeError, ValueError):
        return value


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
    fuzz_schemas: dict[GenerationMode, Any],
    authorization: dict[str, str],
    agent_authorization: dict[str, str],
    real_ids: dict[str, str],
    operation_id: str,
    mode: GenerationMode,
) -> None:
    schema = fuzz_schemas[mode]
    operation = schema.find_operation_by_id(operation_id)
    headers = agent_authorization if operation.path.startswith("/agent/") else authorization

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
        if isinstance(case.query, dict):
            # A long poll with nothing to hand out, and a wait for an execution that
            # does not settle, wait the time asked (`waitFor` alone waits 30 s): keep it short.
            if "waitFor" in case.query:
                case.query.setdefault("timeout", 0)
            for waited in ("wait", "timeout"):
                if waited in case.query:
                    case.query[waited] = _short_wait(case.query[waited])
        case.call_and_validate(headers=headers, checks=[not_a_server_error])

    call()


def test_every_operation_is_fuzzed() -> None:
    fuzzed: set[Any] = {operation_id for operation_id, _ in CASES}
    documented = {
        operation["operationId"]
        for operations in openapi_document()["paths"].values()
        for operation in operations.values()
    }
    assert fuzzed == documented


def test_the_capability_catalogue_answers_as_documented(
    fuzz_app: Flask, authorization: dict[str, str]
) -> None:
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", fuzz_app)
    case = schema.find_operation_by_id("listCapabilities").Case()

    response = case.call_and_validate(
        headers=authorization, checks=[not_a_server_error, response_schema_conformance]
    )

    # The fixture's registry: the contract a confirmed output is checked against.
    assert [item["capability"] for item in response.json()["items"]] == ["machine.command"]
