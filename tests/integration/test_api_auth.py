"""Bearer JWTs: allow-listed algorithms, keys by family, expiry, issuer, audience, scopes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from api_support import SECRET, Api, bearer, problem, raw_token, running_api
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.errors import ConfigError

# An authenticated caller asking for a missing request gets 404; a refused one gets 401.
AUTHENTICATED = 404


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def rsa_files(tmp_path: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = tmp_path / "jwt-private.pem"
    public = tmp_path / "jwt-public.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


@pytest.fixture
def rsa_api(database, rsa_files: tuple[Path, Path]) -> Iterator[Api]:
    private, public = rsa_files
    with running_api(
        database.runtime_dsn,
        jwt_algorithms="RS256,HS256",
        jwt_public_key_file=str(public),
        jwt_private_key_file=str(private),
    ) as api:
        yield api


def _probe(api: Api, headers: dict[str, str]) -> int:
    return api.client().get(f"/api/v1/requests/{uuid.uuid4()}", headers=headers).status_code


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hand_signed(header: dict, payload: dict, key: bytes) -> str:
    """A token signed with HMAC-SHA256 whatever its header declares."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def _claims(settings: Settings, **changes: object) -> dict:
    now = int(time.time())
    claims = {
        "iss": settings.jwt_issuer,
        "aud": settings.jwt_audience,
        "sub": "alice",
        "org": "org-a",
        "scope": "requests:read",
        "iat": now,
        "exp": now + 600,
    }
    claims.update(changes)
    return claims


def test_a_minted_token_is_accepted(api: Api) -> None:
    assert _probe(api, api.headers()) == AUTHENTICATED


def test_a_missing_token_is_401_with_a_bearer_challenge(api: Api) -> None:
    response = api.client().get(f"/api/v1/requests/{uuid.uuid4()}")

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert problem(response)["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer ", "Basic YWxpY2U6c2VjcmV0", "Bearer not.a.jwt", "Bearer a.b"],
)
def test_malformed_authorization_is_401(api: Api, authorization: str) -> None:
    response = api.client().get(
        f"/api/v1/requests/{uuid.uuid4()}", headers={"Authorization": authorization}
    )

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"exp": int(time.time()) - 3600}, id="expired"),
        pytest.param({"iss": "someone-else"}, id="wrong-issuer"),
        pytest.param({"aud": "another-api"}, id="wrong-audience"),
        pytest.param({"nbf": int(time.time()) + 3600}, id="not-yet-valid"),
        pytest.param({"exp": None}, id="no-expiry"),
        pytest.param({"sub": None}, id="no-subject"),
        pytest.param({"org": None}, id="no-organization"),
        pytest.param({"iss": None}, id="no-issuer"),
        pytest.param({"aud": None}, id="no-audience"),
        pytest.param({"org": ""}, id="empty-organization"),
        pytest.param({"sub": 42}, id="numeric-subject"),
        pytest.param({"scope": ["requests:read"]}, id="scope-not-a-string"),
        pytest.param({"org": "org\u0000a"}, id="nul-in-organization"),
    ],
)
def test_tokens_with_bad_claims_are_refused(api: Api, claims: dict) -> None:
    token = raw_token(api.settings, **claims)

    response = api.client().get(f"/api/v1/requests/{uuid.uuid4()}", headers=bearer(token))

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'


def test_expiry_within_the_leeway_is_accepted(api: Api) -> None:
    token = raw_token(api.settings, exp=int(time.time()) - 5)

    assert _probe(api, bearer(token)) == AUTHENTICATED


def test_a_wrong_secret_is_refused(api: Api) -> None:
    token = raw_token(api.settings, key="another-secret-of-sufficient-length-000")

    assert _probe(api, bearer(token)) == 401


def test_alg_none_is_refused(api: Api) -> None:
    token = jwt.encode(_claims(api.settings), None, algorithm="none")

    assert _probe(api, bearer(token)) == 401


def test_an_algorithm_outside_the_allow_list_is_refused(api: Api) -> None:
    token = raw_token(api.settings, algorithm="HS512")

    assert _probe(api, bearer(token)) == 401


def test_rs256_is_refused_when_only_hs256_is_allowed(
    api: Api, rsa_files: tuple[Path, Path]
) -> None:
    token = raw_token(api.settings, key=rsa_files[0].read_bytes(), algorithm="RS256")

    assert _probe(api, bearer(token)) == 401


def test_rs256_tokens_verify_with_the_public_key(rsa_api: Api) -> None:
    token = rsa_api.token()

    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    assert _probe(rsa_api, bearer(token)) == AUTHENTICATED


def test_an_rs256_header_signed_with_the_hmac_secret_is_refused(rsa_api: Api) -> None:
    header = {"alg": "RS256", "typ": "JWT"}
    token = _hand_signed(header, _claims(rsa_api.settings), SECRET.encode())

    assert _probe(rsa_api, bearer(token)) == 401


def test_an_hs256_token_keyed_with_the_public_key_is_refused(
    rsa_api: Api, rsa_files: tuple[Path, Path]
) -> None:
    # The classic confusion: the public key (known to everyone) used as an HMAC secret.
    header = {"alg": "HS256", "typ": "JWT"}
    token = _hand_signed(header, _claims(rsa_api.settings), rsa_files[1].read_bytes())

    assert _probe(rsa_api, bearer(token)) == 401


def test_hs256_still_works_beside_rs256_with_the_secret(rsa_api: Api) -> None:
    token = raw_token(rsa_api.settings)

    assert _probe(rsa_api, bearer(token)) == AUTHENTICATED


def test_a_valid_token_without_the_scope_is_403(api: Api) -> None:
    headers = api.headers(scopes=["flows:admin"])

    response = api.client().get(f"/api/v1/requests/{uuid.uuid4()}", headers=headers)

    assert response.status_code == 403
    body = problem(response)
    assert body["code"] == "INSUFFICIENT_SCOPE"
    assert "requests:read" in body["detail"]


def test_mint_token_writes_the_configured_claims(api: Api) -> None:
    token = mint_token(api.settings, sub="svc", org="org-z", scopes=["a", "b"], ttl_seconds=60)

    claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience=api.settings.jwt_audience)
    assert claims["iss"] == api.settings.jwt_issuer
    assert (claims["sub"], claims["org"], claims["scope"]) == ("svc", "org-z", "a b")
    assert claims["exp"] - claims["iat"] == 60


def test_mint_token_without_any_key_is_a_config_error(tmp_path: Path) -> None:
    settings = Settings.from_env({}, home=str(tmp_path))

    with pytest.raises(ConfigError):
        mint_token(settings, sub="s", org="o", scopes=[])
