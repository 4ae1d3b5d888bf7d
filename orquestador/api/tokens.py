"""Minting JWTs with the configured signing key, for development and tests."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import jwt

from orquestador.config import Settings
from orquestador.errors import ConfigError


def page_audience(settings: Settings) -> str:
    """The audience of page sessions the server mints: only the pages accept it, never the
    API, so a sign-in link's session is no API token."""
    return f"{settings.jwt_audience}:pages"


def mint_token(
    settings: Settings,
    *,
    sub: str,
    org: str,
    scopes: list[str],
    ttl_seconds: int = 3600,
    token_id: str | None = None,
    issued_at: int | None = None,
    audience: str | None = None,
) -> str:
    """A token the API accepts: RS256 with JWT_PRIVATE_KEY_FILE when set, else HS256.

    `token_id` and `issued_at` are given when the token is recorded (an enrolled machine's
    credential stores its `jti` and times); otherwise a fresh id and the current time.
    `audience` defaults to the API's; a page session's is `page_audience`.
    """
    if ttl_seconds <= 0:
        raise ValueError("ttl_seconds must be greater than zero")
    now = int(time.time()) if issued_at is None else issued_at
    claims = {
        "iss": settings.jwt_issuer,
        "aud": audience or settings.jwt_audience,
        "sub": sub,
        "org": org,
        "scope": " ".join(scopes),
        "iat": now,
        "nbf": now,
        "exp": now + ttl_seconds,
        "jti": token_id or uuid.uuid4().hex,
    }
    if settings.jwt_private_key_file:
        try:
            private_key = Path(settings.jwt_private_key_file).read_bytes()
        except OSError as exc:
            raise ConfigError([f"JWT_PRIVATE_KEY_FILE: cannot read it ({exc.strerror})"]) from None
        return jwt.encode(claims, private_key, algorithm="RS256")
    secret = settings.signing_secret()
    if not secret:
        raise ConfigError(
            [
                "JWT_SECRET is not set and no development key exists; set JWT_SECRET or run "
                "`orquestador dev` once"
            ]
        )
    return jwt.encode(claims, secret, algorithm="HS256")
