"""Machine credentials: the agent tokens an operator enrolled, whether each counts, revocation.

An enrolled token's id (its `jti`) is stored with the machine and organization it was
issued for; the API checks it on every request, so a revocation refuses the token from
the next request on, ends the machine's open polls, and the claim that marks a command
sent checks it again. An agent token nobody enrolled (`orquestador token --machine`) is
accepted only while it is short-lived: anything that lasts is enrolled, so revocable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from orquestador.errors import Refusal
from orquestador.machines.bell import announce_revocation

# The longest an agent token may live without being enrolled (a day: enough to try
# things out, short enough that a leaked one need not be revoked).
MAX_AD_HOC_SECONDS = 86400

AUDIT_ENROLLED = "MACHINE_ENROLLED"
AUDIT_REVOKED = "MACHINE_CREDENTIALS_REVOKED"

_COLUMNS = "id, org_id, machine_id, issued_at, expires_at, issued_by, revoked_at, revoked_by"

_INSERT = text(
    f"""
    INSERT INTO machine_credential (id, org_id, machine_id, issued_at, expires_at, issued_by)
    VALUES (:id, :org_id, :machine_id, to_timestamp(:issued_at), to_timestamp(:expires_at),
            :issued_by)
    RETURNING {_COLUMNS}
    """
)

# Only what is still valid is revoked: a repeated revocation changes nothing and keeps
# the first one's time and author.
_REVOKE = text(
    f"""
    UPDATE machine_credential
    SET revoked_at = clock_timestamp(), revoked_by = :revoked_by
    WHERE org_id = :org_id AND machine_id = :machine_id AND revoked_at IS NULL
      AND (CAST(:id AS text) IS NULL OR id = CAST(:id AS text))
    RETURNING {_COLUMNS}
    """
)

_OF_MACHINE = text(
    f"""
    SELECT {_COLUMNS} FROM machine_credential
    WHERE org_id = :org_id
      AND (CAST(:machine_id AS text) IS NULL OR machine_id = CAST(:machine_id AS text))
    ORDER BY machine_id, issued_at, id
    """
)

_BY_ID = text("SELECT org_id, machine_id, revoked_at FROM machine_credential WHERE id = :id")

_AUDIT = text(
    """
    INSERT INTO audit_event (org_id, kind, actor, detail)
    VALUES (:org_id, :kind, :actor, CAST(:detail AS jsonb))
    """
)


@dataclass(frozen=True)
class Credential:
    """One enrolled agent token, by its id; the token itself is never stored."""

    id: str
    org_id: str
    machine_id: str
    issued_at: datetime
    expires_at: datetime
    issued_by: str
    revoked_at: datetime | None
    revoked_by: str | None


class MachineNotEnrolled(Refusal):
    """The machine has no enrolled credential in this organization (or not that one)."""

    code = Refusal.NOT_FOUND


def record_enrolment(
    conn: Connection,
    *,
    credential_id: str,
    org_id: str,
    machine_id: str,
    issued_at: int,
    expires_at: int,
    issued_by: str,
) -> Credential:
    """Store a new credential (times in seconds since the epoch, as in the token) and audit it."""
    row = conn.execute(
        _INSERT,
        {
            "id": credential_id,
            "org_id": org_id,
            "machine_id": machine_id,
            "issued_at": issued_at,
            "expires_at": expires_at,
            "issued_by": issued_by,
        },
    ).one()
    credential = Credential(*row)
    _audit(
        conn,
        org_id,
        AUDIT_ENROLLED,
        issued_by,
        {
            "machineId": machine_id,
            "credentialId": credential_id,
            "expiresAt": credential.expires_at.isoformat(),
        },
    )
    return credential


def revoke_credentials(
    conn: Connection,
    *,
    org_id: str,
    machine_id: str,
    revoked_by: str,
    credential_id: str | None = None,
) -> list[Credential]:
    """Revoke the machine's valid credentials (or only one); those revoked now, audited.

    Raises MachineNotEnrolled when the machine (or that credential of it) was never
    enrolled in the organization: another organization's machine looks the same.
    """
    params = {
        "org_id": org_id,
        "machine_id": machine_id,
        "revoked_by": revoked_by,
        "id": credential_id,
    }
    revoked = [Credential(*row) for row in conn.execute(_REVOKE, params)]
    if not revoked:
        known = credentials_of(conn, org_id=org_id, machine_id=machine_id)
        if not any(credential_id in (None, c.id) for c in known):
            raise MachineNotEnrolled(MachineNotEnrolled.__doc__)
        return []
    # Polls open with a revoked token end when this transaction commits.
    announce_revocation(conn, org_id=org_id, machine_id=machine_id)
    _audit(
        conn,
        org_id,
        AUDIT_REVOKED,
        revoked_by,
        {"machineId": machine_id, "credentialIds": [c.id for c in revoked]},
    )
    return revoked


def credentials_of(
    conn: Connection, *, org_id: str, machine_id: str | None = None
) -> list[Credential]:
    """The organization's credentials (of one machine when given), oldest first."""
    rows = conn.execute(_OF_MACHINE, {"org_id": org_id, "machine_id": machine_id})
    return [Credential(*row) for row in rows]


def credential_refusal(
    conn: Connection,
    *,
    org_id: str,
    machine_id: str,
    token_id: str | None,
    issued_at: int | None,
    expires_at: int | None,
) -> str | None:
    """Why a verified agent token no longer counts, for the server log; None when it does."""
    row = conn.execute(_BY_ID, {"id": token_id}).first() if token_id else None
    if row is None:
        if issued_at is None or expires_at is None:
            return "agent token not enrolled and without iat"
        if expires_at - issued_at > MAX_AD_HOC_SECONDS:
            return "agent token not enrolled and valid for more than 24 hours"
        return None
    if (row.org_id, row.machine_id) != (org_id, machine_id):
        return "machine credential of another machine"
    if row.revoked_at is not None:
        return "machine credential revoked"
    return None


def _audit(conn: Connection, org_id: str, kind: str, actor: str, detail: dict[str, Any]) -> None:
    conn.execute(
        _AUDIT, {"org_id": org_id, "kind": kind, "actor": actor, "detail": json.dumps(detail)}
    )
