"""Sign-in links: a hosting panel hands its user to the pages with a link valid once, for 60 s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from tests.integration.api_support import ORG, OTHER_ORG, Api, problem, running_api

PANEL = ["auth:link", "requests:read"]
HOST = "http://localhost"
EVIL = "https://evil.example"


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _ask(api: Api, scopes: list[str] = PANEL, **body: Any) -> Any:
    wanted = {"sub": "carol", "org": ORG, "scope": "requests:read", **body}
    return api.post("/auth/links", wanted, sub="panel", scopes=scopes)


def _link_path(response: Any) -> str:
    assert response.status_code == 201, response.get_data(as_text=True)
    url = response.get_json()["url"]
    return url[url.index("/ui/auth/link?t=") :]


def test_a_link_signs_its_person_in_once_and_lands_on_its_page(api: Api) -> None:
    path = _link_path(_ask(api, next="/ui/executions?status=FAILED"))
    browser = api.client()
    landed = browser.get(path)
    assert landed.status_code == 200
    held = landed.headers["Set-Cookie"]
    assert held.startswith("orquestador_link_session=")
    assert all(part in held for part in ("HttpOnly", "SameSite=Strict", "Path=/ui/auth/link"))
    page = landed.get_data(as_text=True)
    # A page that moves on by itself, not a redirect (a Strict cookie would not follow one
    # that began on the panel's site).
    onward = "/ui/auth/link/continue?next=/ui/executions?status%3DFAILED"
    assert f'http-equiv="refresh" content="0; url={onward}"' in page
    taken = browser.get(onward)
    assert taken.status_code == 303 and taken.headers["Location"] == "/ui/executions?status=FAILED"
    cookie = next(c for c in taken.headers.getlist("Set-Cookie") if "orquestador_session" in c)
    assert all(part in cookie for part in ("HttpOnly", "SameSite=Strict", "Path=/ui"))
    listed = browser.get("/ui/executions?status=FAILED")
    assert listed.status_code == 200 and "carol" in listed.get_data(as_text=True)

    again = api.client().get(path)
    assert again.status_code == 410 and "Set-Cookie" not in again.headers
    assert "used already or has expired" in again.get_data(as_text=True)


def test_an_expired_link_signs_nobody_in(api: Api, owner_engine: Engine) -> None:
    path = _link_path(_ask(api))
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE sign_in_link SET expires_at = now() - interval '1 s'"))
    assert api.client().get(path).status_code == 410


def test_only_the_secret_s_digest_is_kept(api: Api, runtime_engine: Engine) -> None:
    secret = _link_path(_ask(api)).split("?t=", 1)[1]
    with runtime_engine.connect() as conn:
        (row,) = conn.execute(text("SELECT * FROM sign_in_link")).all()
    assert secret not in repr(tuple(row))
    assert (row.subject, row.org_id, row.scope, row.created_by) == (
        "carol",
        ORG,
        "requests:read",
        "panel",
    )


@pytest.mark.parametrize(
    ("scopes", "body", "status", "code"),
    [
        (["requests:read"], {}, 403, "INSUFFICIENT_SCOPE"),
        (["auth:link"], {}, 403, "SCOPE_NOT_HELD"),  # cannot hand on what it lacks
        (PANEL, {"scope": "requests:read auth:link"}, 403, "SCOPE_NOT_HELD"),
        (PANEL, {"org": OTHER_ORG}, 403, "ORG_MISMATCH"),
        (PANEL, {"next": "https://elsewhere.example/ui/"}, 422, "BODY_INVALID"),
        (PANEL, {"next": "//elsewhere.example/ui/"}, 422, "BODY_INVALID"),
        (PANEL, {"sub": ""}, 422, "BODY_INVALID"),
        (PANEL, {"url": "x"}, 422, "BODY_INVALID"),
    ],
)
def test_a_link_that_may_not_be_made_is_refused_and_nothing_is_kept(
    api: Api,
    runtime_engine: Engine,
    scopes: list[str],
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    response = _ask(api, scopes, **body)
    assert response.status_code == status
    assert problem(response)["code"] == code
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sign_in_link")).scalar_one() == 0


def test_a_link_secret_is_no_bearer_token(api: Api) -> None:
    secret = _link_path(_ask(api)).split("?t=", 1)[1]
    refused = api.client().get("/api/v1/executions", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401


def test_the_runtime_role_cannot_make_a_used_link_usable_again(
    api: Api, runtime_engine: Engine
) -> None:
    path = _link_path(_ask(api))
    assert api.client().get(path).status_code == 200

    with (
        pytest.raises(ProgrammingError, match="a used sign-in link stays used"),
        runtime_engine.begin() as conn,
    ):
        conn.execute(text("UPDATE sign_in_link SET used_at = NULL"))

    assert api.client().get(path).status_code == 410


def _signed_in_as(api: Api, sub: str) -> Any:
    browser = api.client()
    token = api.token(sub=sub, scopes=["requests:read"])
    signed = browser.post("/ui/login", data={"token": token}, headers={"Origin": HOST})
    assert signed.status_code == 303
    return browser


def _who(browser: Any) -> str:
    page = browser.get("/ui/executions").get_data(as_text=True)
    return page.split('<span class="who">', 1)[1].split(" ", 1)[0]


def test_a_link_for_someone_else_asks_before_replacing_the_signed_in_person(api: Api) -> None:
    browser = _signed_in_as(api, "bob")
    browser.get(_link_path(_ask(api)))

    asked = browser.get("/ui/auth/link/continue?next=/ui/executions")

    assert asked.status_code == 200
    page = asked.get_data(as_text=True)
    assert "Continue as carol" in page and "signed in as <strong>bob</strong>" in page
    assert _who(browser) == "bob"
    # Another site's page cannot press the button for the person.
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    form = {"csrf": csrf, "next": "/ui/executions"}
    forged = browser.post("/ui/auth/link/continue", data=form, headers={"Origin": EVIL})
    assert forged.status_code == 403 and _who(browser) == "bob"
    no_token = browser.post("/ui/auth/link/continue", data={"next": "/"}, headers={"Origin": HOST})
    assert no_token.status_code == 403 and _who(browser) == "bob"

    confirmed = browser.post("/ui/auth/link/continue", data=form, headers={"Origin": HOST})

    assert confirmed.status_code == 303 and confirmed.headers["Location"] == "/ui/executions"
    assert _who(browser) == "carol"


def test_a_link_for_the_person_already_signed_in_moves_on_without_asking(api: Api) -> None:
    browser = _signed_in_as(api, "carol")
    browser.get(_link_path(_ask(api)))

    taken = browser.get("/ui/auth/link/continue?next=/ui/executions")

    assert taken.status_code == 303 and _who(browser) == "carol"


def test_continuing_without_a_link_s_session_signs_nobody_in(api: Api) -> None:
    browser = _signed_in_as(api, "bob")
    assert browser.get("/ui/auth/link/continue").status_code == 410
    assert _who(browser) == "bob"
