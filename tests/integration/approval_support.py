"""The approval flow and the built-ins' registry, API and executor the approval tests run on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.api_support import Api, running_api
from tests.integration.worker_support import settings


def approval_flow(
    approvers: dict[str, Any] | None = None, deadline: int = 3600, **node: Any
) -> dict[str, Any]:
    return {
        "key": "reboot",
        "trigger": "manual",
        "dataSchema": {"type": "object", "properties": {"machineId": {"type": "string"}}},
        "initialState": "new",
        "states": ["new", "rebooting", "refused", "timed-out"],
        "transitions": [
            {
                "id": "ask",
                "from": ["new"],
                "actions": [
                    {
                        "id": "ok",
                        "capability": "approval",
                        "version": 1,
                        "input": {
                            "title": {"const": "Reboot m-1?"},
                            "approvers": {"const": approvers or {"subjects": ["bob"]}},
                            "deadlineSeconds": {"const": deadline},
                        },
                        "onError": "timed-out",
                        **node,
                    }
                ],
                "decision": {
                    "hitPolicy": "FIRST",
                    "inputs": ["/actions/ok/decision"],
                    "rules": [
                        {"id": "yes", "when": ['"approved"'], "then": {"to": "rebooting"}},
                        {"id": "no", "when": ["-"], "then": {"to": "refused"}},
                    ],
                },
                "updates": [{"path": "/decidedBy", "from": "/actions/ok/by"}],
            }
        ],
    }


# The fixtures, named as the tests take them (`registry`, `api`, `executor`); a test module
# imports these functions to have them.


@pytest.fixture(name="registry")
def builtins_registry(database: Any) -> AdapterRegistry:
    adapters = AdapterRegistry()
    register_builtins(adapters, settings(database_url=database.runtime_dsn))
    return adapters


@pytest.fixture(name="api")
def builtins_api(database: Any, registry: AdapterRegistry) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=registry) as api:
        yield api


@pytest.fixture(name="executor")
def builtins_executor(database: Any, registry: AdapterRegistry) -> Executor:
    return Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())
