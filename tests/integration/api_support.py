"""Shared pieces of the API tests: settings on the test database, tokens, sample flows."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jwt
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.tokens import mint_token
from orquestador.config import Settings

SECRET = "api-test-signing-secret-" + "0123456789abcdef" * 3
ORG = "org-a"
OTHER_ORG = "org-b"
ALL_SCOPES = ["flows:admin", "requests:read", "requests:write"]

DECOMMISSION: dict[str, Any] = {
    "key": "decommission",
    "trigger": "manual",
    "dataSchema": {
        "type": "object",
        "properties": {"machineId": {"type": "string"}, "power": {"type": "string"}},
        "required": ["machineId"],
    },
    "initialState": "new",
    "states": ["new", "off", "attention"],
    "transitions": [
        {
            "id": "power-off",
            "from": ["new"],
            "actions": [
                {
                    "id": "send",
                    "capability": "machine.command",
                    "version": 1,
                    "input": {
                        "machineId": {"from": "/data/machineId"},
                        "command": {"const": "poweroff"},
                    },
                    "onError": "attention",
                },
                {
                    "id": "wait",
                    "capability": "machine.wait",
                    "version": 1,
                    "input": {
                        "commandId": {"from": "/actions/send/commandId"},
                        "deadlineSeconds": {"const": 30},
                    },
                    "onError": "attention",
                },
            ],
            "decision": {
                "hitPolicy": "FIRST",
                "inputs": ["/actions/wait/status"],
                "rules": [
                    {"id": "ok", "when": ['"succeeded"'], "then": {"to": "off", "outcome": "DONE"}},
                    {
                        "id": "other",
                        "when": ["-"],
                        "then": {"to": "attention", "outcome": "REVIEW"},
                    },
                ],
            },
            "updates": [{"path": "/power", "from": "/actions/wait/status"}],
        },
        {"id": "retry", "from": ["attention"], "actions": [], "to": "new"},
    ],
}


class KnownCapabilities:
    """A stand-in registry that knows a fixed set of (capability, version) pairs."""

    def __init__(self, *pairs: tuple[str, int]) -> None:
        self._pairs = set(pairs)

    def knows(self, capability: str, version: int) -> bool:
        return (capability, version) in self._pairs


REGISTRY = KnownCapabilities(("machine.command", 1), ("machine.wait", 1), ("notify", 1))


def decommission(**changes: Any) -> dict[str, Any]:
    definition = copy.deepcopy(DECOMMISSION)
    definition.update(changes)
    return definition


def api_settings(runtime_dsn: str, **overrides: Any) -> Settings:
    """Both route groups on, HS256 with a known secret, the runtime role's DSN."""
    values: dict[str, Any] = {
        "database_url": runtime_dsn,
        "request_api_enabled": True,
        "flow_admin_enabled": True,
        "jwt_secret": SECRET,
        # Tests put schedules of every second; the quota's own tests set it back.
        "schedule_min_seconds": 1,
        # Tests ask for transitions as fast as they can; the quota's own tests set it back.
        "quota_transitions_per_second": 100_000,
        "quota_transitions_burst": 100_000,
    }
    values.update(overrides)
    return Settings.from_env({}, **values)


def raw_token(
    settings: Settings,
    *,
    key: Any = SECRET,
    algorithm: str = "HS256",
    headers: dict[str, Any] | None = None,
    **claims: Any,
) -> str:
    """A token with exactly the given claim overrides (None removes a claim)."""
    now = int(time.time())
    payload: dict[str, Any] = {
        "iss": settings.jwt_issuer,
        "aud": settings.jwt_audience,
        "sub": "alice",
        "org": ORG,
        "scope": " ".join(ALL_SCOPES),
        "iat": now,
        "exp": now + 600,
    }
    payload.update(claims)
    payload = {name: value for name, value in payload.items() if value is not None}
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    """The real app on the test database, with shortcuts for the common calls."""

    app: Flask
    settings: Settings

    def client(self) -> FlaskClient:
        return self.app.test_client()

    def token(self, *, sub: str = "alice", org: str = ORG, scopes: list[str] | None = None) -> str:
        return mint_token(
            self.settings, sub=sub, org=org, scopes=ALL_SCOPES if scopes is None else scopes
        )

    def headers(self, **who: Any) -> dict[str, str]:
        return bearer(self.token(**who))

    def post(self, path: str, body: Any, **who: Any) -> TestResponse:
        return self.client().post(f"/api/v1{path}", json=body, headers=self.headers(**who))

    def get(self, path: str, **who: Any) -> TestResponse:
        return self.client().get(f"/api/v1{path}", headers=self.headers(**who))

    def publish(self, definition: dict[str, Any] | None = None, **who: Any) -> dict[str, Any]:
        response = self.post("/flows", definition or DECOMMISSION, **who)
        assert response.status_code == 201, response.get_data(as_text=True)
        return response.get_json()

    def create_request(
        self, flow_id: str, data: dict[str, Any] | None = None, **who: Any
    ) -> dict[str, Any]:
        body = {"flowId": flow_id, "data": {"machineId": "m-1"} if data is None else data}
        response = self.post("/requests", body, **who)
        assert response.status_code == 201, response.get_data(as_text=True)
        return response.get_json()

    def transition(
        self, request_id: str, transition: str, revision: int, **who: Any
    ) -> TestResponse:
        body = {"transition": transition, "expectedRevision": revision}
        return self.post(f"/requests/{request_id}/transitions", body, **who)

    def dispose(self) -> None:
        self.app.extensions[EXTENSION_KEY].engine.dispose()


@contextmanager
def running_api(runtime_dsn: str, *, registry: Any = REGISTRY, **overrides: Any) -> Iterator[Api]:
    settings = api_settings(runtime_dsn, **overrides)
    api = Api(create_app(settings, registry=registry), settings)
    try:
        yield api
    finally:
        api.dispose()


def problem(response: TestResponse) -> dict[str, Any]:
    """The problem body, after checking it is one."""
    assert response.mimetype == "application/problem+json", response.get_data(as_text=True)
    body = json.loads(response.get_data())
    assert body["status"] == response.status_code
    assert body["type"].startswith("https://orquestador.dev/problems/")
    return body
