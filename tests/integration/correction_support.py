"""A checkout whose charge is in doubt: the flow, the double and the parked execution the
retry-with-a-correction tests (API, page and browser) start from."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine

from orquestador.actions import Effect, UncertainError
from orquestador.worker.executor import Executor
from tests.integration.worker_support import (
    ORG,
    action,
    flow_definition,
    registry_of,
    run_once,
    scripted,
    settings,
    start_execution,
)
from tests.integration.worker_support import RecordingAdapter as Double

CHECKOUT_SCHEMA = {
    "type": "object",
    "required": ["amount", "currency"],
    "additionalProperties": False,
    "properties": {
        "amount": {"type": "integer", "minimum": 1},
        "currency": {"enum": ["EUR", "USD"]},
        "note": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object"}},
    },
}
DATA = {"amount": 900, "currency": "EUR", "lines": [{"sku": "a"}]}
REASON = "the provider refused the amount; the customer confirmed 950"
OPERATOR: dict[str, Any] = {
    "org": ORG,
    "sub": "operator-1",
    "scopes": ["executions:reconcile", "requests:read-all"],
}


def charge_double(*script: Any) -> Double:
    return Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        output=scripted(UncertainError("connection reset before any answer"), *script),
    )


def park(engine: Engine, charge: Double, key: str | None = None) -> uuid.UUID:
    """A checkout accepted and run once: its charge in doubt, the execution parked."""
    definition = flow_definition(
        [
            action(
                "charge",
                "test.charge",
                input={"amount": {"from": "/data/amount"}, "currency": {"from": "/data/currency"}},
            )
        ],
        data_schema=CHECKOUT_SCHEMA,
    )
    if key is not None:
        definition["key"] = key
    eid = start_execution(engine, definition, dict(DATA))
    assert run_once(engine, Executor(registry_of(charge), settings())) == "RECONCILIATION_REQUIRED"
    return eid
