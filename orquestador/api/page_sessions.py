"""Signed-out page sessions: the server's record that a cookie's token no longer signs in.

The pages keep the person's token in their cookie. Signing out records the token's
SHA-256 (never the token) until the token expires, and every page checks the record:
a copy of the cookie taken before the sign-out is refused from then on, and so is the
same token pasted at the sign-in again.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, text

_REVOKE = text(
    """
    INSERT INTO page_session_revocation (token_sha256, org_id, subject, expires_at)
    VALUES (:digest, :org_id, :subject, to_timestamp(:expires_at))
    ON CONFLICT (token_sha256) DO NOTHING
    """
)

_REVOKED = text("SELECT 1 FROM page_session_revocation WHERE token_sha256 = :digest")

# A record past its token's expiry (and the verifier's leeway) protects nothing: the
# token itself is refused by then. Bounded, so a sign-out never waits on a backlog; no
# row lock in the look-up (the runtime role has no UPDATE here, which FOR UPDATE needs).
_PURGE = text(
    """
    DELETE FROM page_session_revocation
    WHERE token_sha256 IN (
        SELECT token_sha256 FROM page_session_revocation
        WHERE expires_at < clock_timestamp()
        ORDER BY expires_at
        LIMIT 100
    )
    """
)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def revoke_session(
    conn: Connection, token: str, *, org_id: str, subject: str, expires_at: int
) -> None:
    """Record the token as signed out until `expires_at` (seconds since the epoch)."""
    conn.execute(_PURGE)
    conn.execute(
        _REVOKE,
        {
            "digest": token_digest(token),
            "org_id": org_id,
            "subject": subject,
            "expires_at": expires_at,
        },
    )


def session_revoked(conn: Connection, token: str) -> bool:
    return conn.execute(_REVOKED, {"digest": token_digest(token)}).first() is not None
