"""X-Forwarded-Host and X-Forwarded-Proto count only from a peer in TRUSTED_PROXIES: from
anyone else, a sign-in's origin is checked against Host alone and the cookie's Secure
flag follows the connection itself; under gunicorn too, whose own default trusts
loopback."""

from __future__ import annotations

import http.client
import urllib.parse
from pathlib import Path

import pytest
from werkzeug.test import TestResponse

from orquestador.api.pages.routes import SESSION_COOKIE
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.errors import ConfigError
from tests.acceptance import proxy_support
from tests.acceptance.proxy_support import free_port, status_of, wait_for
from tests.integration.api_support import Api, running_api

PROXY = "10.0.0.7"
GUNICORN_SECRET = "forwarded-headers-test-signing-key-0123"
UPSTREAM_HOST = "orquestador-api:8000"
# What a script (no browser needed) sends to pass the origin check with any host it likes.
FORGED = {
    "Host": UPSTREAM_HOST,
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Proto": "https",
    "Origin": "https://evil.example",
}
PROXIED = {**FORGED, "X-Forwarded-Host": "ops.example.com", "Origin": "https://ops.example.com"}


def _login(api: Api, headers: dict[str, str], peer: str) -> TestResponse:
    return api.client().post(
        "/ui/login",
        data={"token": api.token()},
        headers=headers,
        environ_base={"REMOTE_ADDR": peer},
    )


def _cookies(response: TestResponse) -> list[str]:
    return [c for c in response.headers.getlist("Set-Cookie") if c.startswith(SESSION_COOKIE)]


@pytest.mark.parametrize("trusted", ["", "192.168.0.0/16", "::1"])
def test_forwarded_headers_from_an_untrusted_peer_are_ignored(database, trusted: str) -> None:
    with running_api(database.runtime_dsn, trusted_proxies=trusted) as api:
        forged = _login(api, FORGED, peer=PROXY)
        # The proxy's public host counts for nothing either: only Host does.
        proxied = _login(api, PROXIED, peer=PROXY)
        direct = _login(
            api, {"Host": UPSTREAM_HOST, "Origin": f"http://{UPSTREAM_HOST}"}, peer=PROXY
        )

    assert forged.status_code == proxied.status_code == 403
    assert _cookies(forged) == _cookies(proxied) == []
    assert direct.status_code == 303
    (cookie,) = _cookies(direct)
    assert "Secure" not in cookie  # X-Forwarded-Proto is not believed either


@pytest.mark.parametrize("trusted", [PROXY, "10.0.0.0/8", f"192.168.0.1, {PROXY}"])
def test_a_trusted_proxy_names_the_public_host_and_scheme(database, trusted: str) -> None:
    with running_api(database.runtime_dsn, trusted_proxies=trusted) as api:
        proxied = _login(api, PROXIED, peer=PROXY)
        foreign = _login(api, {**PROXIED, "Origin": "https://evil.example"}, peer=PROXY)
        mapped = _login(api, PROXIED, peer=f"::ffff:{PROXY}")

    assert proxied.status_code == mapped.status_code == 303
    (cookie,) = _cookies(proxied)
    assert "Secure" in cookie and "HttpOnly" in cookie
    # Another site's page is still another origin.
    assert foreign.status_code == 403 and _cookies(foreign) == []


@pytest.mark.parametrize("value", ["proxy.internal", "10.0.0.0/33", "10.0.0.1,,nope"])
def test_a_bad_trusted_proxies_value_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"TRUSTED_PROXIES": value})

    assert len(refused.value.problems) == 1
    assert refused.value.problems[0].startswith("TRUSTED_PROXIES: ")


@pytest.mark.parametrize(("trusted", "secure"), [("", False), ("127.0.0.1", True)])
def test_gunicorn_believes_x_forwarded_proto_only_from_trusted_proxies_loopback_included(
    database, tmp_path: Path, trusted: str, secure: bool
) -> None:
    # gunicorn's own default trusts loopback: its wsgi.url_scheme then said https to a
    # client on the same host that merely claimed it, and the cookie went out Secure.
    port = free_port()
    env = {
        "DATABASE_URL": database.runtime_dsn,
        "API_PORT": str(port),
        "API_WORKERS": "1",
        "REQUEST_API_ENABLED": "true",
        "JWT_SECRET": GUNICORN_SECRET,
        "TRUSTED_PROXIES": trusted,
        "LOG_LEVEL": "WARNING",
    }
    token = mint_token(
        Settings.from_env({}, jwt_secret=GUNICORN_SECRET),
        sub="alice",
        org="org-a",
        scopes=["requests:read"],
        ttl_seconds=600,
    )
    with proxy_support.running_api(env, tmp_path / "api.log"):
        wait_for(lambda: status_of(f"http://127.0.0.1:{port}/api/v1/healthz") == 200, 60, "API")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request(
            "POST",
            "/ui/login",
            body=urllib.parse.urlencode({"token": token}),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": f"http://127.0.0.1:{port}",
                "X-Forwarded-Proto": "https",
            },
        )
        answer = connection.getresponse()
        cookies = [c for c in answer.headers.get_all("Set-Cookie") or [] if SESSION_COOKIE in c]
        connection.close()

    assert answer.status == 303
    (cookie,) = cookies
    assert ("Secure" in cookie) is secure
