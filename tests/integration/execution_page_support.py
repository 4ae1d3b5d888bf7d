"""Executions arranged row by row as the worker leaves them, for the view and page tests.

A decided execution is written directly (as the owner role) so that the view and the
page are tested against the audit shapes the engine writes, without running a worker:
a command sent to a machine, a wait whose deadline passed while the command was `sent`
(STEP_ERROR_EXIT with what the step saw), a completed run (TRANSITION_COMPLETED with
the decision table's rules) and a dry run (ACTION_SIMULATED rows).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from tests.integration.api_support import DECOMMISSION, ORG, Api

SEEN_AT = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
# The origin the test client's pages are served from (the sign-in form checks it).
HOST = "http://localhost"


def signed_in(api: Api, **who: Any) -> FlaskClient:
    """A browser-like client signed in to the pages with a token of `who`."""
    client = api.client()
    response = client.post("/ui/login", data={"token": api.token(**who)}, headers={"Origin": HOST})
    assert response.status_code == 303, response.get_data(as_text=True)
    return client


def text_of(html: str) -> str:
    """The page's visible words, roughly: tags dropped, spaces squeezed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@dataclass(frozen=True)
class Arranged:
    """The ids of an arranged execution and of the command it sent."""

    flow_id: str
    request_id: str
    execution_id: str
    command_id: str


def accepted(
    api: Api, definition: dict[str, Any] | None = None, **who: Any
) -> tuple[str, str, str]:
    """(flow id, request id, execution id) of a freshly accepted power-off."""
    flow_id = api.publish(definition or DECOMMISSION, **who)["id"]
    request_id = api.create_request(flow_id, **who)["id"]
    response = api.transition(request_id, "power-off", 1, **who)
    assert response.status_code == 202, response.get_data(as_text=True)
    return flow_id, request_id, response.get_json()["executionId"]


def insert_command(engine: Engine, *, org: str, status: str, key: str) -> str:
    """A machine command row in `status`, as the agent left it; returns its id."""
    with engine.begin() as connection:
        return str(
            connection.execute(
                text(
                    "INSERT INTO machine_command (org_id, machine_id, command, args, status,"
                    " external_key, sent_at, updated_at)"
                    " VALUES (:org, 'm-1', 'poweroff', '[\"--grace\", \"30\"]', :status,"
                    " :key, :sent, now())"
                    " RETURNING id"
                ),
                {"org": org, "status": status, "key": key, "sent": SEEN_AT},
            ).scalar_one()
        )


def _checkpoints(engine: Engine, execution_id: str, command_id: str, wait_status: str) -> None:
    started = SEEN_AT - timedelta(seconds=30)
    wait_error = None if wait_status == "SUCCEEDED" else "WAIT_DEADLINE_EXCEEDED"
    with engine.begin() as connection:
        for action_id, capability, effect, status, error, output in (
            (
                "send",
                "machine.command",
                "IDEMPOTENT_WRITE",
                "SUCCEEDED",
                None,
                {"commandId": command_id, "status": "pending"},
            ),
            ("wait", "machine.wait", "READ_ONLY", wait_status, wait_error, None),
        ):
            connection.execute(
                text(
                    "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                    " fencing_token, input_hash, external_key, effect, capability,"
                    " adapter_version, output, error_code, started_at, first_started_at,"
                    " finished_at)"
                    " VALUES (:id, :action, :status, 1, 1, 'hash', :key, :effect,"
                    " :capability, 1, CAST(:output AS jsonb), :error, :started, :started,"
                    " :finished)"
                ),
                {
                    "id": execution_id,
                    "action": action_id,
                    "status": status,
                    "key": f"{execution_id}:{action_id}",
                    "effect": effect,
                    "capability": capability,
                    "output": json.dumps(output) if output is not None else None,
                    "error": error,
                    "started": started,
                    "finished": SEEN_AT,
                },
            )
            connection.execute(
                text(
                    "INSERT INTO action_attempt (execution_id, action_id, attempt,"
                    " fencing_token, status, error_code, message, started_at, finished_at)"
                    " VALUES (:id, :action, 1, 1, :status, :error, :message, :started,"
                    " :finished)"
                ),
                {
                    "id": execution_id,
                    "action": action_id,
                    "status": status,
                    "error": error,
                    "message": "the command was still sent at the deadline" if error else None,
                    "started": started,
                    "finished": SEEN_AT,
                },
            )


def _end(
    engine: Engine,
    *,
    execution_id: str,
    request_id: str,
    kind: str,
    detail: dict[str, Any],
    status: str,
    error_code: str | None,
    result: dict[str, Any],
    to_state: str,
) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)"
                " SELECT org_id, :kind, request_id, id, 'worker', CAST(:detail AS jsonb)"
                " FROM execution WHERE id = :id"
            ),
            {"kind": kind, "id": execution_id, "detail": json.dumps(detail)},
        )
        connection.execute(
            text(
                "UPDATE execution SET status = :status, attempts = 1, error_code = :error,"
                " result = CAST(:result AS jsonb), started_at = :started,"
                " finished_at = :finished, updated_at = :finished WHERE id = :id"
            ),
            {
                "id": execution_id,
                "status": status,
                "error": error_code,
                "result": json.dumps(result),
                "started": SEEN_AT - timedelta(seconds=31),
                "finished": SEEN_AT,
            },
        )
        connection.execute(
            text(
                "UPDATE request SET state = :state, revision = revision + 1,"
                " busy_execution_id = NULL WHERE id = :id"
            ),
            {"id": request_id, "state": to_state},
        )


def deadline_passed(
    api: Api,
    owner_engine: Engine,
    *,
    now: str = "timed_out",
    purged: bool = False,
    definition: dict[str, Any] | None = None,
    **who: Any,
) -> Arranged:
    """The wait's deadline passed while the command was `sent`: the error exit was taken.

    The command has moved on since (`now`), or was purged by retention.
    """
    org = who.get("org", ORG)
    flow_id, request_id, execution_id = accepted(api, definition, **who)
    command_id = end_past_deadline(owner_engine, execution_id, request_id, org=org, now=now)
    if purged:
        purge(owner_engine, command_id)
    return Arranged(flow_id, request_id, execution_id, command_id)


def end_past_deadline(
    owner_engine: Engine, execution_id: str, request_id: str, *, org: str, now: str
) -> str:
    """deadline_passed's rows for an accepted execution; returns the command's id."""
    command_id = insert_command(owner_engine, org=org, status=now, key=f"{execution_id}:send")
    _checkpoints(owner_engine, execution_id, command_id, "FAILED")
    observed = {"wait": {"commandId": command_id, "status": "sent", "seenAt": SEEN_AT.isoformat()}}
    _end(
        owner_engine,
        execution_id=execution_id,
        request_id=request_id,
        kind="STEP_ERROR_EXIT",
        detail={
            "transitionId": "power-off",
            "actionId": "wait",
            "errorCode": "WAIT_DEADLINE_EXCEEDED",
            "fromState": "new",
            "toState": "attention",
            "revision": 2,
            "observed": observed,
            "actionIds": ["send", "wait"],
        },
        status="FAILED",
        error_code="WAIT_DEADLINE_EXCEEDED",
        result={"outcome": "STEP_ERROR", "toState": "attention", "actionId": "wait"},
        to_state="attention",
    )
    return command_id


def completed(api: Api, owner_engine: Engine, **who: Any) -> Arranged:
    """The command succeeded before the deadline; the decision table chose `off`."""
    org = who.get("org", ORG)
    flow_id, request_id, execution_id = accepted(api, **who)
    command_id = insert_command(
        owner_engine, org=org, status="succeeded", key=f"{execution_id}:send"
    )
    _checkpoints(owner_engine, execution_id, command_id, "SUCCEEDED")
    _end(
        owner_engine,
        execution_id=execution_id,
        request_id=request_id,
        kind="TRANSITION_COMPLETED",
        detail={
            "actionIds": ["send", "wait"],
            "hitPolicy": "FIRST",
            "ruleIds": ["ok"],
            "toState": "off",
            "outcome": "DONE",
            "observed": {
                "wait": {
                    "commandId": command_id,
                    "status": "succeeded",
                    "seenAt": SEEN_AT.isoformat(),
                }
            },
            "revision": 2,
            "transitionId": "power-off",
            "fromState": "new",
        },
        status="SUCCEEDED",
        error_code=None,
        result={"outcome": "DONE", "toState": "off", "ruleIds": ["ok"], "hitPolicy": "FIRST"},
        to_state="off",
    )
    return Arranged(flow_id, request_id, execution_id, command_id)


def dry_run(api: Api, owner_engine: Engine, **who: Any) -> str:
    """A simulated execution on a simulated request that would have sent a poweroff."""
    _, request_id, execution_id = accepted(api, **who)
    with owner_engine.begin() as connection:
        # One statement: the schema checks that request and execution agree at its end.
        connection.execute(
            text(
                "WITH simulated AS (UPDATE request SET simulation = true WHERE id = :request)"
                " UPDATE execution SET simulation = true WHERE id = :execution"
            ),
            {"request": request_id, "execution": execution_id},
        )
        connection.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)"
                " SELECT org_id, 'ACTION_SIMULATED', request_id, id, 'worker',"
                " CAST(:detail AS jsonb) FROM execution WHERE id = :id"
            ),
            {
                "id": execution_id,
                "detail": json.dumps(
                    {
                        "actionId": "send",
                        "capability": "machine.command",
                        "version": 1,
                        "effect": "IDEMPOTENT_WRITE",
                        "summary": "send poweroff to machine m-1",
                    }
                ),
            },
        )
    return execution_id


def purge(owner_engine: Engine, command_id: str) -> None:
    """What retention does to a final command."""
    with owner_engine.begin() as connection:
        connection.execute(text("DELETE FROM machine_command WHERE id = :id"), {"id": command_id})


def point_audit_at(owner_engine: Engine, execution_id: str, command_id: str) -> None:
    """Tamper: rewrite the command id inside the execution's frozen observation."""
    with owner_engine.begin() as connection:
        changed = connection.execute(
            text(
                "UPDATE audit_event SET detail = jsonb_set(detail,"
                " '{observed,wait,commandId}', to_jsonb(CAST(:command AS text)))"
                " WHERE execution_id = :id AND detail ? 'observed'"
            ),
            {"id": execution_id, "command": command_id},
        ).rowcount
    assert changed == 1


def new_id() -> str:
    return str(uuid.uuid4())


def waiting(
    api: Api, owner_engine: Engine, *, command_status: str = "sent", **who: Any
) -> Arranged:
    """The wait's latest round parked on a `command_status` command: its first round
    started 8 s ago, its latest just now (the execution is WAITING)."""
    org = who.get("org", ORG)
    flow_id, request_id, execution_id = accepted(api, **who)
    command_id = park_wait(owner_engine, execution_id, org=org, command_status=command_status)
    return Arranged(flow_id, request_id, execution_id, command_id)


def park_wait(
    owner_engine: Engine, execution_id: str, *, org: str, command_status: str = "sent"
) -> str:
    """waiting's rows for an accepted execution; returns the command's id."""
    command_id = insert_command(
        owner_engine, org=org, status=command_status, key=f"{execution_id}:send"
    )
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability,"
                " adapter_version, error_code, observed, first_started_at, started_at,"
                " finished_at) VALUES (:id, 'wait', 'FAILED', 1, 1, 'hash', :key,"
                " 'READ_ONLY', 'machine.wait', 1, 'NOT_READY',"
                " jsonb_build_object('commandId', CAST(:command AS text), 'status', 'pending'),"
                " now() - interval '8 s', now(), now())"
            ),
            {"id": execution_id, "key": f"{execution_id}:wait", "command": command_id},
        )
        connection.execute(
            text(
                "UPDATE execution SET status = 'WAITING',"
                " next_attempt_at = now() + interval '1 s' WHERE id = :id"
            ),
            {"id": execution_id},
        )
    return command_id


def cancel_directly(owner_engine: Engine, execution_id: str) -> None:
    """What cancel leaves of a waiting execution: CANCELLED, the wait's checkpoint as it was."""
    with owner_engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = 'CANCELLED', finished_at = now() WHERE id = :id"),
            {"id": execution_id},
        )
        connection.execute(
            text("UPDATE request SET busy_execution_id = NULL WHERE busy_execution_id = :id"),
            {"id": execution_id},
        )


def fixed_destination(api: Api, owner_engine: Engine, **who: Any) -> str:
    """A transition without a decision table that notified someone: TRANSITION_COMPLETED
    with no hit policy and no rules, and a notify step's observation (no command)."""
    _, request_id, execution_id = accepted(api, **who)
    _end(
        owner_engine,
        execution_id=execution_id,
        request_id=request_id,
        kind="TRANSITION_COMPLETED",
        detail={
            "actionIds": ["tell"],
            "hitPolicy": None,
            "ruleIds": [],
            "toState": "off",
            "outcome": None,
            "observed": {"tell": {"noticeId": new_id(), "email": "queued"}},
            "revision": 2,
            "transitionId": "power-off",
            "fromState": "new",
        },
        status="SUCCEEDED",
        error_code=None,
        result={"toState": "off"},
        to_state="off",
    )
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability,"
                " adapter_version, started_at, finished_at) VALUES (:id, 'tell', 'SUCCEEDED',"
                " 1, 1, 'hash', :key, 'IDEMPOTENT_WRITE', 'notify', 1, now(), now())"
            ),
            {"id": execution_id, "key": f"{execution_id}:tell"},
        )
    return execution_id


def twin(owner_engine: Engine, execution_id: str, twin_id: str) -> None:
    """Another (cancelled) execution of the same request under a chosen id: two ids that
    share their first digits, as a short id may."""
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO execution (id, request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot, status)"
                " SELECT :twin, request_id, org_id, flow_id, transition_id, accepted_revision,"
                " accepted_state, actor_snapshot, 'CANCELLED' FROM execution WHERE id = :id"
            ),
            {"id": execution_id, "twin": twin_id},
        )
