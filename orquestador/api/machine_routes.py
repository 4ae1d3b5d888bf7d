"""Operators' machine routes: revoking a machine agent's enrolled credentials."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, jsonify

from orquestador.api.auth import (
    SCOPE_MACHINES_ADMIN,
    current_caller,
    identity_claim_problem,
    requires_scope,
)
from orquestador.api.context import engine
from orquestador.api.problems import not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.machines.credentials import Credential, MachineNotEnrolled, revoke_credentials

log = logging.getLogger(__name__)

blueprint = Blueprint("machines", __name__, url_prefix=f"{API_PREFIX}/machines")


def credential_view(credential: Credential) -> dict[str, Any]:
    return {
        "id": credential.id,
        "issuedAt": timestamp(credential.issued_at),
        "expiresAt": timestamp(credential.expires_at),
        "revokedAt": timestamp(credential.revoked_at),
    }


@blueprint.delete("/<machine_id>/credentials")
@requires_scope(SCOPE_MACHINES_ADMIN)
def revoke(machine_id: str) -> Response:
    caller = current_caller()
    # No machine can have an id an agent token could not name: missing, like any other.
    if identity_claim_problem(machine_id) or any(c.isspace() for c in machine_id):
        raise not_found()
    try:
        with engine().begin() as conn:
            revoked = revoke_credentials(
                conn, org_id=caller.org, machine_id=machine_id, revoked_by=caller.sub
            )
    except MachineNotEnrolled:
        # Another organization's machine of the same id is this organization's unknown one.
        raise not_found() from None
    if revoked:
        log.info(
            "machine credentials revoked",
            extra={"org_id": caller.org, "machine_id": machine_id, "revoked": len(revoked)},
        )
    return jsonify({"machineId": machine_id, "revoked": [credential_view(c) for c in revoked]})
