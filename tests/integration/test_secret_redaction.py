"""An adapter's exception that quotes a configured secret never stores or logs it (SPEC 16).

A worker runs with an API key in its environment and a routes file whose headers carry
credentials; an operator adapter raises a RuntimeError quoting all of them. The attempt
history, the ExecutionView, the evidence, the execution page and the worker's log lines
say `[redacted]` where each secret was.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import Engine

from orquestador.actions import Effect, load_registry
from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.logs import JsonLineFormatter, TextFormatter
from orquestador.redaction import error_line
from orquestador.worker.daemon import Worker
from orquestador.worker.messages import attempt_message
from tests.integration.api_support import Api, running_api
from tests.integration.worker_support import (
    ORG,
    OWNER,
    action,
    attempt_history,
    flow_definition,
    scripted,
    settings,
    start_execution,
    status_is,
    wait_until,
)
from tests.integration.worker_support import RecordingAdapter as Double

API_KEY = "sk_live_4f9a8b7c6d5e"  # PAYMENTS_API_KEY: secret by its name
ROUTE_AUTH = "billing-auth-5e6f7a8b9c"  # BILLING_AUTH: secret because a route header names it
ROUTE_LITERAL = "tenant-literal-0d1e2f"  # written in the routes file itself
SECRETS = (API_KEY, ROUTE_AUTH, ROUTE_LITERAL)
CARD = "4111-1111-1111-1111"

ROUTES = """
[[route]]
capability = "billing.lookup"
version = 1
effect = "READ_ONLY"
method = "GET"
url = "http://127.0.0.1:9/customers/{customerId}"
headers = { Authorization = "Bearer ${BILLING_AUTH}", X-Tenant = "tenant-literal-0d1e2f" }
timeout_seconds = 5
max_attempts = 1
"""

OPERATOR = {
    "org": ORG,
    "sub": "operator-1",
    "scopes": ["executions:reconcile", "requests:read-all"],
}


def _leaky_failure() -> RuntimeError:
    """What a careless client library raises: everything it had at hand, in its text."""
    return RuntimeError(
        f"401 from https://pay.example/v1/charges?key={quote(API_KEY)} with api_key={API_KEY!r},"
        f" headers {{'Authorization': 'Bearer {ROUTE_AUTH}', 'X-Tenant': '{ROUTE_LITERAL}'}}"
        f" for card {CARD}"
    )


def _charge() -> Double:
    return Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        max_attempts=1,
        output=scripted(_leaky_failure()),
    )


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's environment as an operator sets it."""
    routes = tmp_path / "integrations.toml"
    routes.write_text(ROUTES)
    monkeypatch.setenv("PAYMENTS_API_KEY", API_KEY)
    monkeypatch.setenv("BILLING_AUTH", ROUTE_AUTH)
    monkeypatch.setenv("INTEGRATIONS_FILE", str(routes))
    return routes


@pytest.fixture
def worker(database, runtime_engine: Engine, configured: Path) -> Iterator[Worker]:
    configured_settings = settings(
        database_url=database.runtime_dsn, integrations_file=str(configured)
    )
    # The routes file is the one the worker loads: its route is real configuration.
    registry = load_registry(configured_settings)
    assert registry.knows("billing.lookup", 1)
    registry.add(_charge().adapter())
    running = Worker(configured_settings, runtime_engine, registry)
    running.start()
    yield running
    running.stop(timeout=30)


@pytest.fixture
def api(database) -> Iterator[Api]:
    registry = load_registry(settings())
    registry.add(_charge().adapter())
    with running_api(database.runtime_dsn, registry=registry) as api:
        api.app.extensions[ADAPTERS_EXTENSION] = registry
        yield api


def _page(api: Api, execution_id: uuid.UUID) -> str:
    client = api.client()
    token = api.token(sub=OWNER, org=ORG)
    signed = client.post("/ui/login", data={"token": token}, headers={"Origin": "http://localhost"})
    assert signed.status_code == 303
    page = client.get(f"/ui/executions/{execution_id}")
    assert page.status_code == 200
    return page.get_data(as_text=True)


def _assert_redacted(shown: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in shown, f"{where} shows {secret}"
        assert quote(secret) not in shown, f"{where} shows {secret} percent-encoded"
    assert "[redacted]" in shown, f"{where}: {shown[:400]}"


def test_a_secret_in_an_adapter_exception_is_redacted_wherever_it_is_kept_or_shown(
    worker: Worker, runtime_engine: Engine, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orquestador")
    definition = flow_definition(
        [action("charge", "test.charge", input={"card": {"from": "/data/card"}})]
    )
    execution_id = start_execution(runtime_engine, definition, {"card": CARD})
    wait_until(
        status_is(runtime_engine, execution_id, "RECONCILIATION_REQUIRED"), what="it to park"
    )

    [attempt] = attempt_history(runtime_engine, execution_id, "charge")
    _assert_redacted(attempt.message, "the attempt history")
    assert attempt.message.startswith("RuntimeError: 401 from https://pay.example/v1/charges?key=")
    assert "card [input]" in attempt.message

    view = api.get(f"/executions/{execution_id}", sub=OWNER, org=ORG)
    assert view.status_code == 200
    _assert_redacted(view.get_data(as_text=True), "the ExecutionView")

    evidence = api.get(f"/executions/{execution_id}/evidence", **OPERATOR)
    assert evidence.status_code == 200
    [step] = evidence.get_json()["steps"]
    assert step["message"] == attempt.message
    _assert_redacted(evidence.get_data(as_text=True), "the evidence")

    page = _page(api, execution_id)
    _assert_redacted(page, "the execution page")

    lines = [
        formatter.format(record)
        for record in caplog.records
        for formatter in (TextFormatter(), JsonLineFormatter())
    ]
    uncertain = [line for line in lines if "action outcome uncertain" in line]
    assert len(uncertain) == 2  # the one record, in both formats
    for line in uncertain:
        _assert_redacted(line, "the worker's log")
    for line in lines:
        assert not any(secret in line for secret in SECRETS), line


def test_every_kind_of_adapter_message_and_error_line_is_redacted(configured: Path) -> None:
    from orquestador.actions import PermanentError, TransientError, UncertainError

    text = f"refused key {API_KEY} / {ROUTE_AUTH} / {ROUTE_LITERAL}"
    for exc in (
        TransientError(text),
        PermanentError("REFUSED", text),
        UncertainError(text),
        ValueError(text),
    ):
        message = attempt_message(exc, {"card": CARD})
        _assert_redacted(message, type(exc).__name__)
        assert message.count("[redacted]") == 3
    # Infrastructure error lines (a job ended by an exception) are redacted too.
    _assert_redacted(error_line(RuntimeError(text)), "error_line")


def test_a_secret_is_redacted_before_the_message_is_cut(configured: Path) -> None:
    message = attempt_message(RuntimeError("x" * 1000 + API_KEY), {})
    assert API_KEY[:6] not in message and len(message) <= 1024


def test_short_values_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # A one-to-three character "secret" would cut every word it appears in.
    monkeypatch.setenv("SHORT_TOKEN", "abc")
    monkeypatch.setenv("FEATURE_KEY_ENABLED", "true")
    message = attempt_message(RuntimeError("abcdef is not true"), {})
    assert message == "RuntimeError: abcdef is not true"


def test_a_secret_that_is_also_an_input_is_redacted_not_blanked(configured: Path) -> None:
    message = attempt_message(RuntimeError(f"bad key {API_KEY}"), {"key": API_KEY})
    assert message == "RuntimeError: bad key [redacted]"
    assert re.fullmatch(r"[^\[]*\[redacted\]", message)
