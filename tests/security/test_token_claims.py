"""A validly signed token is still input: claims outside their bounds are 401, never a 500."""

from __future__ import annotations

import random
import secrets
import uuid
from collections.abc import Iterator

import pytest
from werkzeug.test import TestResponse

from tests.integration.api_support import (
    ALL_SCOPES,
    DECOMMISSION,
    Api,
    bearer,
    problem,
    raw_token,
    running_api,
)

# The bounds docs/API.md publishes ("Limits").
MAX_IDENTITY_CHARACTERS = 200
MAX_SCOPE_CHARACTERS = 2048
MAX_SCOPES = 64
# Random text does not compress, so it reaches PostgreSQL's btree entry limit (about
# 2.7 KB) as it is: an org or sub this long failed the insert and answered 500.
OVERLONG = secrets.token_urlsafe(3000)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _assert_refused(response: TestResponse) -> None:
    assert response.status_code == 401, response.get_data(as_text=True)
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert problem(response)["code"] == "UNAUTHENTICATED"


def _four_byte_text(length: int, seed: int) -> str:
    # Mathematical alphanumerics: printable, four bytes each in UTF-8.
    alphabet = [ch for ch in map(chr, range(0x1D400, 0x1D7FF)) if ch.isprintable()]
    return "".join(random.Random(seed).choices(alphabet, k=length))


def test_an_overlong_org_cannot_publish_a_flow(api: Api) -> None:
    token = raw_token(api.settings, org=OVERLONG)

    response = api.client().post("/api/v1/flows", json=DECOMMISSION, headers=bearer(token))

    _assert_refused(response)


def test_an_overlong_sub_cannot_create_a_request(api: Api) -> None:
    flow = api.publish()
    token = raw_token(api.settings, sub=OVERLONG)
    body = {"flowId": flow["id"], "data": {"machineId": "m-1"}}

    response = api.client().post("/api/v1/requests", json=body, headers=bearer(token))

    _assert_refused(response)


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"sub": "a" * (MAX_IDENTITY_CHARACTERS + 1)}, id="sub-one-over"),
        pytest.param({"org": "a" * (MAX_IDENTITY_CHARACTERS + 1)}, id="org-one-over"),
        pytest.param({"sub": "alice\n"}, id="newline-in-sub"),
        pytest.param({"org": "org\ta"}, id="tab-in-org"),
        pytest.param({"sub": "alice\u202egnp.exe"}, id="bidi-override-in-sub"),
        pytest.param({"org": "org\u2028a"}, id="line-separator-in-org"),
        pytest.param({"sub": "\u00a0"}, id="no-break-space-sub"),
        pytest.param({"sub": "alice\u0085"}, id="c1-control-in-sub"),
        pytest.param(
            {"scope": "requests:read " + "x" * MAX_SCOPE_CHARACTERS}, id="scope-over-length"
        ),
        pytest.param(
            {"scope": " ".join(["requests:read"] + [f"s{i}" for i in range(MAX_SCOPES)])},
            id="too-many-scopes",
        ),
        pytest.param({"scope": "requests:read\nflows:admin"}, id="newline-in-scope"),
    ],
)
def test_claims_outside_their_bounds_are_refused(api: Api, claims: dict) -> None:
    token = raw_token(api.settings, **claims)

    response = api.client().get(f"/api/v1/requests/{uuid.uuid4()}", headers=bearer(token))

    _assert_refused(response)


def test_claims_at_their_bounds_are_accepted_and_stored(api: Api) -> None:
    sub = _four_byte_text(MAX_IDENTITY_CHARACTERS, seed=1)
    org = _four_byte_text(MAX_IDENTITY_CHARACTERS, seed=2)
    scopes = ALL_SCOPES + [f"extra:{i}" for i in range(MAX_SCOPES - len(ALL_SCOPES))]
    scope = " ".join(scopes)
    assert len(scopes) == MAX_SCOPES and len(scope) <= MAX_SCOPE_CHARACTERS
    client, headers = api.client(), bearer(raw_token(api.settings, sub=sub, org=org, scope=scope))

    published = client.post("/api/v1/flows", json=DECOMMISSION, headers=headers)
    assert published.status_code == 201, published.get_data(as_text=True)
    body = {"flowId": published.get_json()["id"], "data": {"machineId": "m-1"}}
    created = client.post("/api/v1/requests", json=body, headers=headers)
    assert created.status_code == 201, created.get_data(as_text=True)
    read = client.get(f"/api/v1/requests/{created.get_json()['id']}", headers=headers)

    assert read.status_code == 200
