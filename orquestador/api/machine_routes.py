"""Operators' machine routes: a command's output; revoking a machine agent's credentials."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request

from orquestador.api.auth import (
    SCOPE_MACHINES_ADMIN,
    SCOPE_REQUESTS_READ_ALL,
    current_caller,
    identity_claim_problem,
    requires_scope,
)
from orquestador.api.context import engine
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.domain.errors import Problem
from orquestador.machines.credentials import Credential, MachineNotEnrolled, revoke_credentials
from orquestador.machines.directory import command_output
from orquestador.machines.output import read_after

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
    _machine(machine_id)
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


# Who reads machines: an operator of them, or whoever may read every request.
MACHINE_READERS = (SCOPE_REQUESTS_READ_ALL, SCOPE_MACHINES_ADMIN)
# The largest offset a reader may ask after (JSON's safe integers).
MAX_OFFSET = 2**53


def _machine(machine_id: str) -> str:
    # No machine can have an id an agent token could not name: missing, like any other.
    if identity_claim_problem(machine_id) or any(c.isspace() for c in machine_id):
        raise not_found()
    return machine_id


def _command_id(command_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(command_id)
    except ValueError:
        raise not_found() from None


def _offset() -> int:
    raw = request.args.get("after", "0")
    if not raw.isdigit() or int(raw) > MAX_OFFSET:
        raise ApiProblem(
            400,
            "QUERY_INVALID",
            "A query parameter is invalid.",
            problems=[Problem("/after", f"a byte offset from 0 to {MAX_OFFSET}")],
        )
    return int(raw)


@blueprint.get("/<machine_id>/commands/<command_id>/output")
@requires_scope(*MACHINE_READERS)
def output(machine_id: str, command_id: str) -> Response:
    caller = current_caller()
    after = _offset()
    with engine().connect() as conn:
        found = command_output(
            conn,
            org_id=caller.org,
            machine_id=_machine(machine_id),
            command_id=_command_id(command_id),
        )
    if found is None:
        raise not_found()
    text, _ = read_after(found.stored, after)
    return jsonify(
        {
            "output": text,
            "nextOffset": max(after, found.stored.size),
            "complete": found.complete,
            "truncated": found.stored.dropped > 0,
        }
    )
