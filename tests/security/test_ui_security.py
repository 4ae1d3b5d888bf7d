"""The execution pages' defences: CSP, cookie flags, CSRF on the forms, no token in a
page, a refused token leaves no cookie, and names written by flow authors stay text."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine
from werkzeug.test import TestResponse

from orquestador.api.pages.routes import CONTENT_SECURITY_POLICY, SESSION_COOKIE
from tests.integration.api_support import ALL_SCOPES, DECOMMISSION, Api, raw_token, running_api
from tests.integration.execution_page_support import deadline_passed, point_audit_at

HOST = "http://localhost"
SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _login(client: FlaskClient, token: str, **headers: str) -> TestResponse:
    return client.post("/ui/login", data={"token": token}, headers=headers)


def _signed_in(api: Api, token: str) -> FlaskClient:
    client = api.client()
    assert _login(client, token, Origin=HOST).status_code == 303
    return client


def _set_cookies(response: TestResponse) -> list[str]:
    return response.headers.getlist("Set-Cookie")


def test_every_ui_page_carries_the_strict_policy(api: Api, owner_engine: Engine) -> None:
    arranged = deadline_passed(api, owner_engine)
    execution_id = arranged.execution_id
    token = api.token(scopes=[*ALL_SCOPES, "notices:read", "approvals:decide", "plans:admin"])
    client = _signed_in(api, token)
    reader = _signed_in(api, api.token(scopes=["requests:read"]))
    anonymous = api.client()
    answers = {
        "login": anonymous.get("/ui/login"),
        "refused login": _login(api.client(), "not-a-token", Origin=HOST),
        "cross-site login": _login(api.client(), token, Origin="https://evil.example"),
        "redirect": anonymous.get("/ui/executions"),
        "list": client.get("/ui/executions"),
        "queue": client.get("/ui/executions?status=RECONCILIATION_REQUIRED"),
        "execution": client.get(f"/ui/executions/{execution_id}"),
        "not found": client.get("/ui/executions/00000000-0000-4000-8000-000000000000"),
        "bad filter": client.get("/ui/executions?limit=0"),
        "bad date": client.get("/ui/executions?createdAfter=yesterday"),
        "search": client.get("/ui/executions?machineId=m-1&flowKey=decommission"),
        "request": client.get(f"/ui/requests/{arranged.request_id}"),
        "flows": client.get("/ui/flows"),
        "flow": client.get(f"/ui/flows/{arranged.flow_id}"),
        "flows refused": reader.get("/ui/flows"),
        "machine": client.get("/ui/machines/m-1"),
        "notices": client.get("/ui/notices"),
        "approvals": client.get("/ui/approvals"),
        "schedules": client.get("/ui/schedules"),
        "schedule": client.get("/ui/schedules/nightly"),
        "forged pause": client.post("/ui/schedules/nightly/pause"),
        "forged resume": client.post("/ui/schedules/nightly/resume"),
        "forged schedule run": client.post("/ui/schedules/nightly/run"),
        "forged schedule delete": client.post("/ui/schedules/nightly/delete"),
        "unknown path": client.get("/ui/nothing/here"),
        "stylesheet": client.get("/ui/static/ui.css"),
        "cancel form": client.get(f"/ui/executions/{execution_id}/cancel"),
        "forged cancel": client.post(f"/ui/executions/{execution_id}/cancel"),
        "forged decision": client.post(f"/ui/approvals/{execution_id}/decision"),
        "forged dismiss": client.post(f"/ui/notices/{execution_id}/dismiss"),
        "forged dry run": client.post(f"/ui/flows/{execution_id}/dry-runs"),
        "forged run": client.post(f"/ui/flows/{arranged.flow_id}/runs"),
        "reconcile form": client.get(f"/ui/executions/{execution_id}/reconcile"),
        "forged reconciliation": client.post(f"/ui/executions/{execution_id}/reconciliation"),
        "forged rollout pause": client.post(f"/ui/executions/{execution_id}/rollout/pause"),
        "bulk preview": client.get("/ui/bulk?action=cancel&status=FAILED"),
        "forged bulk": client.post("/ui/bulk"),
        "bulk progress": client.get(f"/ui/bulk/{execution_id}"),
        "logout": client.post("/ui/logout", headers={"Origin": HOST}),
        "used sign-in link": anonymous.get("/ui/auth/link?t=nothing-of-ours"),
        "no link session": anonymous.get("/ui/auth/link/continue"),
    }
    served = {rule.rule for rule in api.app.url_map.iter_rules() if rule.rule.startswith("/ui")}

    for name, response in answers.items():
        headers = response.headers
        assert headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, name
        assert headers["X-Frame-Options"] == "DENY", name
        assert headers["X-Content-Type-Options"] == "nosniff", name
        assert headers["Cache-Control"] == "no-store" or name == "stylesheet", name
        if response.mimetype == "text/html":
            html = response.get_data(as_text=True)
            assert "<script" not in html and " style=" not in html and "<style" not in html
            assert response.status_code in (302, 303) or '<meta name="viewport"' in html, name
    for directive in (
        "default-src 'none'",
        "style-src 'self'",
        "img-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ):
        assert directive in CONTENT_SECURITY_POLICY
    assert served == {
        "/ui",
        "/ui/",
        "/ui/login",
        "/ui/logout",
        "/ui/auth/link",
        "/ui/auth/link/continue",
        "/ui/executions",
        "/ui/executions/<execution_id>",
        "/ui/executions/<execution_id>/cancel",
        "/ui/approvals/<approval_id>/decision",
        "/ui/notices/<notice_id>/dismiss",
        "/ui/flows/<flow_id>/dry-runs",
        "/ui/flows/<flow_id>/runs",
        "/ui/executions/<execution_id>/reconcile",
        "/ui/executions/<execution_id>/reconciliation",
        "/ui/executions/<execution_id>/rollout/<what>",
        "/ui/bulk",
        "/ui/bulk/<bulk_id>",
        "/ui/requests/<request_id>",
        "/ui/flows",
        "/ui/flows/<flow_id>",
        "/ui/machines/<path:machine_id>",
        "/ui/notices",
        "/ui/approvals",
        "/ui/schedules",
        "/ui/schedules/<schedule_id>",
        "/ui/schedules/<schedule_id>/pause",
        "/ui/schedules/<schedule_id>/resume",
        "/ui/schedules/<schedule_id>/run",
        "/ui/schedules/<schedule_id>/delete",
        "/ui/<path:anything>",
        "/ui/static/<path:filename>",
    }, "a new page: add it to the answers above"


def test_the_session_cookie_is_httponly_strict_and_only_for_the_pages(api: Api) -> None:
    response = _login(api.client(), api.token(), Origin=HOST)

    (cookie,) = _set_cookies(response)
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back


def test_over_https_the_cookie_is_secure(api: Api) -> None:
    client = api.app.test_client()
    response = client.post(
        "/ui/login",
        data={"token": api.token()},
        headers={"Origin": "https://localhost"},
        base_url="https://localhost",
    )

    (cookie,) = _set_cookies(response)
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie


@pytest.mark.parametrize(
    "token",
    ["not-a-token", "eyJhbGciOiJub25lIn0.e30.", "expired", "wrong-key"],
)
def test_a_refused_token_gets_a_clear_page_and_no_cookie(api: Api, token: str) -> None:
    if token == "expired":
        token = raw_token(api.settings, exp=1_000_000_000, iat=999_999_000)
    elif token == "wrong-key":
        token = raw_token(api.settings, key="another-secret-" + "x" * 40)

    response = _login(api.client(), token, Origin=HOST)

    assert response.status_code == 401
    assert response.mimetype == "text/html"
    assert "That token was not accepted: it is invalid or has expired." in response.get_data(
        as_text=True
    )
    assert _set_cookies(response) == []
    assert token not in response.get_data(as_text=True)


def test_a_token_without_read_scope_is_refused_at_sign_in(api: Api) -> None:
    response = _login(api.client(), api.token(scopes=["flows:admin"]), Origin=HOST)

    assert response.status_code == 403
    assert "does not allow reading executions" in response.get_data(as_text=True)
    assert _set_cookies(response) == []


def test_an_empty_or_oversized_token_is_a_400_page(api: Api) -> None:
    empty = _login(api.client(), "  ", Origin=HOST)
    huge = _login(api.client(), "x" * 5000, Origin=HOST)

    assert (empty.status_code, huge.status_code) == (400, 400)
    assert _set_cookies(empty) == _set_cookies(huge) == []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Referer": "https://evil.example/x"},
    ],
    ids=["no origin", "other site", "opaque origin", "other site's referer"],
)
def test_sign_in_from_another_site_is_refused(api: Api, headers: dict[str, str]) -> None:
    response = _login(api.client(), api.token(), **headers)

    assert response.status_code == 403
    assert _set_cookies(response) == []


def test_a_same_origin_referer_stands_in_for_a_missing_origin(api: Api) -> None:
    response = _login(api.client(), api.token(), Referer=f"{HOST}/ui/login")

    assert response.status_code == 303
    assert len(_set_cookies(response)) == 1


def test_sign_out_from_another_site_is_refused_and_keeps_the_session(api: Api) -> None:
    client = _signed_in(api, api.token())

    response = client.post("/ui/logout", headers={"Origin": "https://evil.example"})

    assert response.status_code == 403
    assert _set_cookies(response) == []
    assert client.get("/ui/executions").status_code == 200


def test_a_link_cannot_sign_anyone_out(api: Api) -> None:
    client = _signed_in(api, api.token())

    response = client.get("/ui/logout")

    assert response.status_code == 404
    assert _set_cookies(response) == []
    assert client.get("/ui/executions").status_code == 200


def test_no_page_contains_the_token(api: Api, owner_engine: Engine) -> None:
    execution_id = deadline_passed(api, owner_engine).execution_id
    token = api.token()
    client = _signed_in(api, token)
    signature = token.rsplit(".", 1)[1]

    pages = [
        client.get("/ui/login"),
        client.get("/ui/executions"),
        client.get(f"/ui/executions/{execution_id}"),
        client.get("/ui/executions/00000000-0000-4000-8000-000000000000"),
        client.get("/ui/executions?status=BOGUS"),
    ]

    for page in pages:
        body = page.get_data(as_text=True)
        assert signature not in body
        assert all(signature not in value for _, value in page.headers.items())


def test_an_expired_session_goes_back_to_sign_in_and_is_forgotten(api: Api) -> None:
    client = api.client()
    client.set_cookie(SESSION_COOKIE, raw_token(api.settings, exp=1_000_000_000), path="/ui")

    response = client.get("/ui/executions")

    assert response.status_code == 303
    assert response.headers["Location"].startswith("/ui/login")
    assert any(c.startswith(f"{SESSION_COOKIE}=;") for c in _set_cookies(response))


def test_names_written_by_flow_authors_show_as_text(api: Api, owner_engine: Engine) -> None:
    definition = copy.deepcopy(DECOMMISSION)
    definition["initialState"] = SCRIPT
    definition["states"] = [SCRIPT, "off", "attention"]
    definition["transitions"][0]["from"] = [SCRIPT]
    definition["transitions"][1]["to"] = SCRIPT
    arranged = deadline_passed(api, owner_engine, definition=definition)
    point_audit_at(owner_engine, arranged.execution_id, '"><img src=x>')
    client = _signed_in(api, api.token())

    page = client.get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True)
    listing = client.get("/ui/executions").get_data(as_text=True)

    for html in (page, listing):
        assert "<script" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in page
    assert re.search(r"&#34;&gt;&lt;img src=x&gt;|&quot;&gt;&lt;img src=x&gt;", page)


def test_behind_a_tls_proxy_the_cookie_is_secure_and_the_public_host_is_the_origin(
    database,
) -> None:
    # The test client's peer is 127.0.0.1: here, the trusted proxy.
    with running_api(database.runtime_dsn, trusted_proxies="127.0.0.1") as api:
        _login_behind_the_proxy(api)


def _login_behind_the_proxy(api: Api) -> None:
    proxied = {
        "Host": "orquestador-api:8000",
        "X-Forwarded-Host": "ops.example.com",
        "X-Forwarded-Proto": "https",
        "Origin": "https://ops.example.com",
    }

    response = _login(api.client(), api.token(), **proxied)
    foreign = _login(api.client(), api.token(), **{**proxied, "Origin": "https://evil.example"})

    (cookie,) = _set_cookies(response)
    assert "Secure" in cookie and "HttpOnly" in cookie
    assert foreign.status_code == 403 and _set_cookies(foreign) == []


# Signing in and out are guarded by the origin check alone: no session yet, or one ending.
SESSION_FORMS = {"/ui/login", "/ui/logout"}
EVERY_SCOPE = [
    *ALL_SCOPES,
    "executions:cancel",
    "executions:reconcile",
    "approvals:decide",
    "notices:read",
    "plans:admin",
]


def test_every_action_form_refuses_a_cross_site_post_and_one_without_the_token(
    api: Api, owner_engine: Engine
) -> None:
    """Whatever action a page posts to, now or added later: both refusals, nothing done."""
    execution_id = deadline_passed(api, owner_engine).execution_id
    client = _signed_in(api, api.token(scopes=EVERY_SCOPE))
    page = client.get(f"/ui/executions/{execution_id}").get_data(as_text=True)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None
    actions = [
        rule.rule
        for rule in api.app.url_map.iter_rules()
        if rule.rule.startswith("/ui") and "POST" in (rule.methods or ())
        if rule.rule not in SESSION_FORMS
    ]
    assert len(actions) >= 6  # cancel, reconcile, approve, dismiss, dry run, bulk
    for action in actions:
        path = re.sub(r"<[^>]+>", execution_id, action)
        cross_site = client.post(
            path, data={"csrf": found.group(1)}, headers={"Origin": "https://evil.example"}
        )
        without_token = client.post(path, data={}, headers={"Origin": HOST})
        assert cross_site.status_code == 403, path
        assert "page of this server" in cross_site.get_data(as_text=True), path
        assert without_token.status_code == 403, path
        assert "out of date" in without_token.get_data(as_text=True), path
    with owner_engine.connect() as connection:
        kinds = connection.exec_driver_sql(
            "SELECT kind FROM audit_event WHERE execution_id = %s", (execution_id,)
        ).scalars()
        assert "EXECUTION_CANCELLED" not in set(kinds)
