"""What a token's claims may say: the scopes, the machine subject, the bounds on identity
and scope claims. Light on purpose: the command line mints and checks tokens without
loading the web layer."""

from __future__ import annotations

from typing import Any

SCOPE_FLOWS_ADMIN = "flows:admin"
SCOPE_REQUESTS_READ = "requests:read"
SCOPE_REQUESTS_READ_ALL = "requests:read-all"
SCOPE_REQUESTS_WRITE = "requests:write"
SCOPE_EXECUTIONS_RECONCILE = "executions:reconcile"
SCOPE_EXECUTIONS_CANCEL = "executions:cancel"
SCOPE_PLANS_ADMIN = "plans:admin"
SCOPE_EVENTS_WRITE = "events:write"
SCOPE_NOTICES_READ = "notices:read"
SCOPE_ORG_ADMIN = "org:admin"
# A hosting panel's service: asks for one-time sign-in links for its users (POST /auth/links).
SCOPE_AUTH_LINK = "auth:link"
# Deciding approvals: with it, a caller sees and decides the approvals that name it.
SCOPE_APPROVALS_DECIDE = "approvals:decide"
# A machine agent: `sub` is "machine:<machineId>"; it sees only its own machine's commands.
SCOPE_AGENT = "agent"
# An operator of the organization's machines: revokes their agents' credentials.
SCOPE_MACHINES_ADMIN = "machines:admin"
MACHINE_SUBJECT_PREFIX = "machine:"

# Claims end up in indexed columns and in every request's actor snapshot: a signature
# proves who issued a token, not that its values are sane. Bounded well under
# PostgreSQL's btree entry limit (about 2.7 KB) even at four bytes per character.
MAX_IDENTITY_CHARACTERS = 200
MAX_SCOPE_CHARACTERS = 2048
MAX_SCOPES = 64


def identity_claim_problem(value: Any) -> str | None:
    """Why a `sub` or `org` claim is refused, or None when it is acceptable."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_IDENTITY_CHARACTERS:
        return f"is longer than {MAX_IDENTITY_CHARACTERS} characters"
    # isprintable() refuses control and format characters, line and paragraph separators,
    # NUL and unpaired surrogates (which jsonb cannot store); the plain space passes.
    if not value.isprintable():
        return "contains characters that are not printable"
    return None


def scope_claim_problem(value: Any) -> str | None:
    """Why a `scope` claim is refused, or None; absent counts as the empty string."""
    if not isinstance(value, str):
        return "must be a space-separated string"
    if len(value) > MAX_SCOPE_CHARACTERS:
        return f"is longer than {MAX_SCOPE_CHARACTERS} characters"
    if not value.isprintable():
        return "contains characters that are not printable"
    if len(value.split()) > MAX_SCOPES:
        return f"names more than {MAX_SCOPES} scopes"
    return None
