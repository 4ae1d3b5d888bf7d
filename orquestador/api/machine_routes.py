"""Operators' machine routes: the organization's machines, their agents' liveness, their
commands and a command's output; revoking a machine agent's credentials."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.claims import (
    SCOPE_MACHINES_ADMIN,
    SCOPE_REQUESTS_READ_ALL,
    identity_claim_problem,
)
from orquestador.api.context import EXTENSION_KEY, engine
from orquestador.api.paging import page_limit, query_problem
from orquestador.api.problems import not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.machines.credentials import Credential, revoke_credentials
from orquestador.machines.directory import (
    command_output,
    find_machine,
    list_machines,
    machine_commands,
)
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
    with engine().begin() as conn:
        revoked = revoke_credentials(
            conn, org_id=caller.org, machine_id=machine_id, revoked_by=caller.sub
        )
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
        raise query_problem("after", f"a byte offset from 0 to {MAX_OFFSET}")
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


# Pages of machines and of a machine's commands.
PAGE_DEFAULT, PAGE_MAX = 50, 200


def _offline_seconds() -> int:
    return current_app.extensions[EXTENSION_KEY].settings.agent_offline_seconds


@blueprint.get("")
@requires_scope(*MACHINE_READERS)
def machines() -> Response:
    caller = current_caller()
    limit = page_limit(request.args, PAGE_DEFAULT, PAGE_MAX)
    after = request.args.get("after")
    if after is not None and identity_claim_problem(after):
        raise query_problem("after", "the `next` of the page before")
    with engine().connect() as conn:
        found = list_machines(
            conn,
            org_id=caller.org,
            offline_seconds=_offline_seconds(),
            limit=limit + 1,
            after=after,
        )
    more, found = len(found) > limit, found[:limit]
    return jsonify({"items": [m.as_json() for m in found], "next": found[-1].id if more else None})


@blueprint.get("/<machine_id>")
@requires_scope(*MACHINE_READERS)
def machine(machine_id: str) -> Response:
    caller = current_caller()
    with engine().connect() as conn:
        found = find_machine(
            conn,
            org_id=caller.org,
            machine_id=_machine(machine_id),
            offline_seconds=_offline_seconds(),
        )
    if found is None:
        raise not_found()
    return jsonify(found.as_json())


@blueprint.get("/<machine_id>/commands")
@requires_scope(*MACHINE_READERS)
def commands(machine_id: str) -> Response:
    caller = current_caller()
    limit = page_limit(request.args, PAGE_DEFAULT, PAGE_MAX)
    with engine().connect() as conn:
        # One snapshot: the machine and its commands as of one moment.
        conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            found = find_machine(
                conn,
                org_id=caller.org,
                machine_id=_machine(machine_id),
                offline_seconds=_offline_seconds(),
            )
            if found is None:
                raise not_found()
            items = machine_commands(conn, org_id=caller.org, machine_id=found.id, limit=limit)
    return jsonify({"machineId": found.id, "items": items})
