"""Bearer JWT verification and the one decorator that guards every protected route."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from flask import g, request
from sqlalchemy import Connection

from orquestador.api.claims import (
    MACHINE_SUBJECT_PREFIX,
    MAX_IDENTITY_CHARACTERS,
    SCOPE_REQUESTS_READ,
    SCOPE_REQUESTS_READ_ALL,
    identity_claim_problem,
    scope_claim_problem,
)
from orquestador.api.context import BearerVerifier, api_context, engine
from orquestador.api.page_sessions import session_revoked
from orquestador.api.problems import ApiProblem
from orquestador.api.tokens import page_audience
from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.machines.credentials import credential_refusal

log = logging.getLogger(__name__)

# A broader scope satisfies the narrower one it contains.
_IMPLIED_BY = {SCOPE_REQUESTS_READ: (SCOPE_REQUESTS_READ_ALL,)}

_REQUIRED_CLAIMS = ["exp", "sub", "org", "iss", "aud"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Caller:
    """Who is calling, as the verified token says."""

    sub: str
    org: str
    scopes: frozenset[str]
    # The token's own facts (jti, iat, exp), for the machine credential check.
    token_id: str | None = None
    issued_at: int | None = None
    expires_at: int | None = None

    @property
    def machine(self) -> str | None:
        """The machine an agent token names (`sub` machine:<id>), else None."""
        machine = self.sub.removeprefix(MACHINE_SUBJECT_PREFIX)
        return machine if machine != self.sub and machine else None

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes or any(s in self.scopes for s in _IMPLIED_BY.get(scope, ()))

    def snapshot(self) -> dict[str, Any]:
        return {"sub": self.sub, "org": self.org, "scopes": sorted(self.scopes)}


class InvalidToken(Exception):
    """The bearer token is missing or was refused."""


def refusal_reason(error: Exception) -> str:
    """Why PyJWT refused a token, in words for the server log (never for the caller)."""
    if isinstance(error, jwt.ExpiredSignatureError):
        return "expired"
    if isinstance(error, jwt.InvalidSignatureError):
        return "bad signature"
    if isinstance(error, jwt.InvalidAudienceError):
        return "wrong audience"
    if isinstance(error, jwt.InvalidIssuerError):
        return "wrong issuer"
    if isinstance(error, jwt.MissingRequiredClaimError):
        return f"missing claim {error.claim}"
    if isinstance(error, jwt.ImmatureSignatureError):
        return "not yet valid"
    if isinstance(error, jwt.InvalidIssuedAtError):
        return "bad iat claim"
    if isinstance(error, jwt.DecodeError):
        return "malformed"
    return f"refused ({type(error).__name__})"


def _is_hmac(algorithm: str) -> bool:
    return algorithm.startswith("HS")


class TokenVerifier:
    """Checks tokens locally against the configured allow-list, keys, issuer and audience."""

    def __init__(self, settings: Settings) -> None:
        self._algorithms = frozenset(settings.jwt_algorithm_list)
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        # The pages also take the sessions the server mints for them (sign-in links);
        # the API takes only its own audience.
        self._page_audiences = [settings.jwt_audience, page_audience(settings)]
        self._leeway = settings.jwt_leeway_seconds
        self._settings = settings
        self._public_key: Any = None
        if settings.jwt_public_key_file:
            pem = Path(settings.jwt_public_key_file).read_bytes()
            try:
                self._public_key = load_pem_public_key(pem)
            except ValueError as exc:
                raise ConfigError(
                    [f"JWT_PUBLIC_KEY_FILE: not a PEM public key ({type(exc).__name__})"]
                ) from None

    def _key_for(self, algorithm: str) -> Any:
        # The key follows the algorithm family, never the other way round: a token
        # declaring RS256 is never checked against the HMAC secret (key confusion).
        if _is_hmac(algorithm):
            secret = self._settings.signing_secret()
            if not secret:
                raise InvalidToken("no HMAC secret is configured")
            return secret
        if self._public_key is None:
            raise InvalidToken("no public key is configured")
        return self._public_key

    def verify(self, token: str, *, for_pages: bool = False) -> Caller:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("malformed token") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            raise InvalidToken("algorithm not allowed")
        key = self._key_for(algorithm)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=self._issuer,
                audience=self._page_audiences if for_pages else self._audience,
                leeway=self._leeway,
                options={"require": _REQUIRED_CLAIMS},
            )
        except (jwt.PyJWTError, ValueError, TypeError) as refused:
            raise InvalidToken(refusal_reason(refused)) from None
        sub, org, scope = claims.get("sub"), claims.get("org"), claims.get("scope", "")
        for name, value in (("sub", sub), ("org", org)):
            reason = identity_claim_problem(value)
            if reason:
                raise InvalidToken(f"{name} {reason}")
        reason = scope_claim_problem(scope)
        if reason:
            raise InvalidToken(f"scope {reason}")
        return Caller(
            sub=sub,
            org=org,
            scopes=frozenset(scope.split()),
            token_id=_claim_text(claims.get("jti")),
            issued_at=_claim_seconds(claims.get("iat")),
            expires_at=_claim_seconds(claims.get("exp")),
        )


def _claim_text(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_IDENTITY_CHARACTERS else None


def _claim_seconds(value: Any) -> int | None:
    # PyJWT has checked exp, nbf and iat are numbers when present.
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bearer_token() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _unauthenticated(detail: str, *, invalid: bool) -> ApiProblem:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return ApiProblem(401, "UNAUTHENTICATED", detail, headers={"WWW-Authenticate": challenge})


def authenticate(verifier: BearerVerifier) -> Caller:
    token = _bearer_token()
    if token is None:
        raise _unauthenticated("A bearer token is required.", invalid=False)
    try:
        caller = verifier.verify(token)
        refusal = stored_refusal(caller, token)
        if refusal:
            raise InvalidToken(refusal)
        return caller
    except InvalidToken as exc:
        # The reason is logged for operators; the token itself never is, and the caller
        # hears the same words whatever the reason.
        log.info("refused a bearer token: %s", exc, extra={"reason": str(exc)})
        raise _unauthenticated("The bearer token is invalid or expired.", invalid=True) from None


SIGNED_OUT = "signed out of the pages"


def stored_refusal(caller: Any, token: str) -> str | None:
    """Why the database says a verified token no longer counts, or None: signed out of the
    pages (a pasted token is an API token too, and its sign-out ends both), or a machine's
    credential revoked or never enrolled.

    Read on every request, so a sign-out or a revocation holds from the next one on; a
    database that does not answer is a 503, never a refusal an agent would give up on.
    """
    with engine().connect() as conn:
        if session_revoked(conn, token):
            return SIGNED_OUT
        return machine_credential_refusal(conn, caller)


def machine_credential_refusal(conn: Connection, caller: Any) -> str | None:
    """Why a machine's token no longer counts (revoked, not enrolled and long-lived), or None."""
    # Any other subject is no machine's: the agent routes refuse it 403 NOT_A_MACHINE.
    if not isinstance(caller, Caller) or caller.machine is None:
        return None
    return credential_refusal(
        conn,
        org_id=caller.org,
        machine_id=caller.machine,
        token_id=caller.token_id,
        issued_at=caller.issued_at,
        expires_at=caller.expires_at,
    )


def requires_scope(*scopes: str) -> Callable[[F], F]:
    """Authenticate the bearer token and demand one of `scopes`; the caller lands in
    `g.caller`."""
    needed = " or ".join(scopes)

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            caller = authenticate(api_context().verifier)
            if not any(caller.has_scope(scope) for scope in scopes):
                raise ApiProblem(
                    403, "INSUFFICIENT_SCOPE", f"This operation needs the {needed} scope."
                )
            g.caller = caller
            return view(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    return decorate


def current_caller() -> Caller:
    return g.caller
