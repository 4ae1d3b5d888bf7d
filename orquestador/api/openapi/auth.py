"""OpenAPI paths and schemas of sign-in links."""

from __future__ import annotations

from typing import Any

from orquestador.api.auth_routes import LINK_ANSWER, LINK_BODY
from orquestador.api.openapi.parts import SECURED, WRITE_ERRORS, body, json_response, problems, ref

SCHEMAS: dict[str, Any] = {"SignInLinkRequest": LINK_BODY, "SignInLink": LINK_ANSWER}


def paths() -> dict[str, Any]:
    return {
        "/auth/links": {
            "post": {
                "operationId": "createSignInLink",
                "summary": "A one-time link that signs a person in to the pages (60 s)",
                "description": "Scope `auth:link` (a hosting panel's service token). The link "
                "signs in `sub` of the caller's own organization with the scopes named, each "
                "one the caller holds (never `auth:link`), and lands on `next`. Used once; "
                "`GET` of the link answers 410 after that or after 60 seconds.",
                "security": SECURED,
                "requestBody": body(ref("SignInLinkRequest")),
                "responses": {
                    "201": json_response(ref("SignInLink"), "The link."),
                    **problems(
                        *WRITE_ERRORS,
                        s403="The token lacks `auth:link` (`INSUFFICIENT_SCOPE`), names another "
                        "organization (`ORG_MISMATCH`) or a scope it does not hold "
                        "(`SCOPE_NOT_HELD`).",
                    ),
                },
            },
        },
    }
