"""Sign-in links: a hosting panel hands its user over to the pages with a one-time link.

The panel asks for a link with a service token (`POST /auth/links`, scope `auth:link`);
the link carries a random secret of which only the SHA-256 is stored, valid for
LINK_SECONDS and usable once: using it is one conditional update of an unused,
unexpired row, so a second use (or a copy of the link) finds it used. The person then
holds a page session: a token for the subject, organization and scopes the panel named,
minted with the server's signing key, in the same cookie a pasted token would be.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from sqlalchemy import Connection, Row, func, insert, text

from orquestador.db.schema import sign_in_link

LINK_SECONDS = 60
# How long the page session a link opens lasts (a pasted token keeps its own expiry).
SESSION_SECONDS = 8 * 3600
SECRET_BYTES = 32
MAX_SECRET_CHARACTERS = 100
DEFAULT_PAGE = "/ui/executions"

_USE = text(
    """
    UPDATE sign_in_link SET used_at = clock_timestamp()
    WHERE secret_sha256 = :digest AND used_at IS NULL AND expires_at > clock_timestamp()
    RETURNING org_id, subject, scope, next_page
    """
)

# Links a day past their expiry guard nothing: bounded, so asking for a link never waits
# on a backlog.
_PURGE = text(
    """
    DELETE FROM sign_in_link
    WHERE secret_sha256 IN (
        SELECT secret_sha256 FROM sign_in_link
        WHERE expires_at < clock_timestamp() - interval '1 day'
        ORDER BY expires_at
        LIMIT 100
    )
    """
)


def landing_page(target: str | None) -> str | None:
    """A page of this UI to land on (the executions by default), or None for anything
    else: never another site, never a path a browser would read otherwise."""
    if not target:
        return DEFAULT_PAGE
    if not target.startswith("/ui/") or target.startswith("//"):
        return None
    if "\\" in target or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    return target


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_link(
    conn: Connection,
    *,
    org: str,
    subject: str,
    scopes: list[str],
    next_page: str,
    created_by: str,
) -> tuple[str, datetime]:
    """Record a link; its secret (never stored) and when it expires."""
    conn.execute(_PURGE)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    expires_at = conn.execute(
        insert(sign_in_link)
        .values(
            secret_sha256=_digest(secret),
            org_id=org,
            subject=subject,
            scope=" ".join(scopes),
            next_page=next_page,
            created_by=created_by,
            expires_at=func.clock_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, LINK_SECONDS),
        )
        .returning(sign_in_link.c.expires_at)
    ).scalar_one()
    return secret, expires_at


def use_link(conn: Connection, secret: str) -> Row | None:
    """Whom the link signs in and where to, marking it used; None if used or expired."""
    if not secret or len(secret) > MAX_SECRET_CHARACTERS:
        return None
    return conn.execute(_USE, {"digest": _digest(secret)}).first()
