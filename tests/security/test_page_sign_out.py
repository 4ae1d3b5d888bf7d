"""Signing out revokes the page session on the server: a copy of the cookie kept from
before (another tab, a stolen one) no longer opens a page, and the same token cannot
sign in again; the server keeps a digest of the token, never the token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from orquestador.api.pages.routes import SESSION_COOKIE
from tests.integration.api_support import Api, running_api

HOST = "http://localhost"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _signed_in(api: Api, token: str) -> FlaskClient:
    client = api.client()
    response = client.post("/ui/login", data={"token": token}, headers={"Origin": HOST})
    assert response.status_code == 303
    return client


def _with_cookie(api: Api, value: str) -> FlaskClient:
    client = api.client()
    client.set_cookie(SESSION_COOKIE, value, path="/ui")
    return client


def test_a_copy_of_the_cookie_is_refused_after_sign_out(api: Api, owner_engine: Engine) -> None:
    token = api.token()
    client = _signed_in(api, token)
    copied = client.get_cookie(SESSION_COOKIE, path="/ui")
    assert copied is not None
    assert _with_cookie(api, copied.value).get("/ui/executions").status_code == 200

    signed_out = client.post("/ui/logout", headers={"Origin": HOST})

    assert signed_out.status_code == 303
    replayed = _with_cookie(api, copied.value).get("/ui/executions")
    assert replayed.status_code == 303
    assert replayed.headers["Location"].startswith("/ui/login")
    with owner_engine.connect() as conn:
        stored = conn.execute(
            text("SELECT token_sha256, org_id, subject FROM page_session_revocation")
        ).all()
    assert len(stored) == 1 and stored[0][1:] == ("org-a", "alice")
    assert token not in repr(stored)


def test_the_signed_out_token_cannot_sign_in_again_but_a_new_one_can(api: Api) -> None:
    token = api.token()
    _signed_in(api, token).post("/ui/logout", headers={"Origin": HOST})

    again = api.client().post("/ui/login", data={"token": token}, headers={"Origin": HOST})

    assert again.status_code == 401
    assert "signed out" in again.get_data(as_text=True)
    assert again.headers.getlist("Set-Cookie") == []
    # A new token differs from the old one (its own jti).
    fresh = _signed_in(api, api.token())
    assert fresh.get("/ui/executions").status_code == 200


def test_sign_out_from_another_site_revokes_nothing(api: Api, owner_engine: Engine) -> None:
    client = _signed_in(api, api.token())

    refused = client.post("/ui/logout", headers={"Origin": "https://evil.example"})

    assert refused.status_code == 403
    assert client.get("/ui/executions").status_code == 200
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM page_session_revocation")).scalar() == 0


def test_records_past_their_token_expiry_are_purged_at_a_later_sign_out(
    api: Api, owner_engine: Engine
) -> None:
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO page_session_revocation (token_sha256, org_id, subject, expires_at)"
                " VALUES ('old', 'org-a', 'bob', now() - interval '1 hour'),"
                " ('live', 'org-a', 'bob', now() + interval '1 hour')"
            )
        )

    _signed_in(api, api.token()).post("/ui/logout", headers={"Origin": HOST})

    with owner_engine.connect() as conn:
        kept = set(
            conn.execute(text("SELECT subject || ':' || token_sha256 FROM page_session_revocation"))
            .scalars()
            .all()
        )
    assert "bob:old" not in kept and "bob:live" in kept and len(kept) == 2


def test_the_runtime_role_cannot_delete_a_sign_out_before_its_token_expires(
    api: Api, runtime_engine: Engine
) -> None:
    client = _signed_in(api, api.token())
    copied = client.get_cookie(SESSION_COOKIE, path="/ui")
    assert copied is not None
    assert client.post("/ui/logout", headers={"Origin": HOST}).status_code == 303

    with (
        pytest.raises(ProgrammingError, match="a sign-out is kept until its token expires"),
        runtime_engine.begin() as conn,
    ):
        conn.execute(text("DELETE FROM page_session_revocation"))

    assert _with_cookie(api, copied.value).get("/ui/executions").status_code == 303


def _bearer_get(api: Api, token: str) -> int:
    answer = api.client().get("/api/v1/executions", headers={"Authorization": f"Bearer {token}"})
    return answer.status_code


def test_a_token_signed_out_of_the_pages_is_refused_by_the_api_too(api: Api) -> None:
    token = api.token()
    assert _bearer_get(api, token) == 200
    _signed_in(api, token).post("/ui/logout", headers={"Origin": HOST})

    assert _bearer_get(api, token) == 401


def test_a_sign_in_link_s_session_opens_pages_but_is_no_api_token(api: Api) -> None:
    made = api.post(
        "/auth/links",
        {"sub": "carol", "org": "org-a", "scope": "requests:read"},
        sub="panel",
        scopes=["auth:link", "requests:read"],
    )
    url = made.get_json()["url"]
    browser = api.client()
    browser.get(url[url.index("/ui/") :])
    browser.get("/ui/auth/link/continue")
    session = browser.get_cookie(SESSION_COOKIE, path="/ui")
    assert session is not None
    assert browser.get("/ui/executions").status_code == 200

    assert _bearer_get(api, session.value) == 401
    browser.post("/ui/logout", headers={"Origin": HOST})
    assert _bearer_get(api, session.value) == 401
