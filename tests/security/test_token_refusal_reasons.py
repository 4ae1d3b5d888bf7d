"""A refused token says why in the server log (expired, bad signature, audience, missing
claim, ...) and never to the caller: every refusal answers the same bytes."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.api_support import Api, bearer, raw_token, running_api

HOST = "http://localhost"
AUTH_LOGGER = "orquestador.api.auth"
UI_LOGGER = "orquestador.api.pages.routes"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _refused(api: Api) -> dict[str, str]:
    now = int(time.time())
    return {
        "expired": raw_token(api.settings, iat=now - 7200, exp=now - 3600),
        "bad signature": raw_token(api.settings, key="another-secret-" + "x" * 40),
        "wrong audience": raw_token(api.settings, aud="someone-else"),
        "wrong issuer": raw_token(api.settings, iss="https://issuer.example"),
        "missing claim exp": raw_token(api.settings, exp=None),
        "missing claim sub": raw_token(api.settings, sub=None),
        "missing claim org": raw_token(api.settings, org=None),
        "not yet valid": raw_token(api.settings, nbf=now + 3600),
        "malformed token": "not.a.token",
    }


def test_each_refusal_is_logged_with_its_reason_and_answered_alike(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    answers = {}
    for reason, token in _refused(api).items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=AUTH_LOGGER):
            response = api.client().get(f"/api/v1/requests/{uuid.uuid4()}", headers=bearer(token))

        assert response.status_code == 401, reason
        lines = [r.getMessage() for r in caplog.records if r.name == AUTH_LOGGER]
        assert lines == [f"refused a bearer token: {reason}"], reason
        assert token not in caplog.text
        answers[reason] = (response.headers["WWW-Authenticate"], response.get_data())

    # Nothing in the answer tells one reason from another.
    assert len(set(answers.values())) == 1
    challenge, body = next(iter(answers.values()))
    assert challenge == 'Bearer error="invalid_token"'
    assert json.loads(body)["detail"] == "The bearer token is invalid or expired."


def test_a_refused_sign_in_logs_its_reason_and_shows_one_message(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    pages = set()
    for reason, token in _refused(api).items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=UI_LOGGER):
            response = api.client().post(
                "/ui/login", data={"token": token}, headers={"Origin": HOST}
            )

        assert response.status_code == 401, reason
        lines = [r.getMessage() for r in caplog.records if r.name == UI_LOGGER]
        assert lines == [f"refused a sign-in token: {reason}"], reason
        pages.add(response.get_data())

    assert len(pages) == 1
