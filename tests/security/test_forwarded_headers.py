"""X-Forwarded-Host and X-Forwarded-Proto count only from a peer in TRUSTED_PROXIES: from
anyone else, a sign-in's origin is checked against Host alone and the cookie's Secure
flag follows the connection itself."""

from __future__ import annotations

import pytest
from werkzeug.test import TestResponse

from orquestador.api.pages.routes import SESSION_COOKIE
from orquestador.config import Settings
from orquestador.errors import ConfigError
from tests.integration.api_support import Api, running_api

PROXY = "10.0.0.7"
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
