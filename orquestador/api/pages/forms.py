"""What a form posted by a page must show before it changes anything.

Two checks, both needed: the form came from a page of this server (Origin, or Referer
when a proxy strips Origin), and it carries the page session's CSRF token. The token is
an HMAC of the session's own token, so it needs no storage, differs per session and
dies with it; another site can neither read the cookie nor compute the token from it.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from flask import request

from orquestador.api.problems import ApiProblem
from orquestador.api.proxies import from_trusted_proxy

CSRF_FIELD = "csrf"
_CSRF_PURPOSE = b"orquestador page form"


def csrf_token(session_token: str) -> str:
    """The token every form of this page session carries."""
    return hmac.new(session_token.encode(), _CSRF_PURPOSE, hashlib.sha256).hexdigest()


def require_csrf(session_token: str) -> None:
    sent = request.form.get(CSRF_FIELD, "")
    if not hmac.compare_digest(sent.encode(), csrf_token(session_token).encode()):
        raise ApiProblem(
            403,
            "CSRF_TOKEN_INVALID",
            "This form is out of date or did not come from your page: reload it and try again.",
        )


def require_same_origin() -> None:
    if not _same_origin():
        raise ApiProblem(
            403,
            "CROSS_SITE_FORM",
            "This form must be sent from a page of this server. Reload the page and try again.",
        )


def _same_origin() -> bool:
    """A form post from a page of this server, not from another site.

    Browsers send Origin with every POST; Referer stands in when a proxy strips it.
    """
    source = request.headers.get("Origin") or request.headers.get("Referer")
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    # Behind a reverse proxy the Host may be the upstream's; the proxy's X-Forwarded-Host
    # names the one the browser used. Only a proxy of TRUSTED_PROXIES is believed: any
    # other client (a script, not a browser) could name whatever host its Origin names.
    hosts = {request.host, _forwarded("X-Forwarded-Host")}
    return parts.scheme in ("http", "https") and parts.netloc in hosts - {""}


def _forwarded(name: str) -> str:
    """The first (the client-facing) value of an X-Forwarded-* header from a trusted proxy."""
    if not from_trusted_proxy():
        return ""
    return request.headers.get(name, "").split(",")[0].strip()


def over_https() -> bool:
    # A trusted TLS-terminating proxy says so in X-Forwarded-Proto.
    return request.is_secure or _forwarded("X-Forwarded-Proto").lower() == "https"
