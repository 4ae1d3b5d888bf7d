"""A dry run's request accepts only dry runs: a real transition on it answers 404, and the
schema refuses an execution whose kind is not its request's, whoever writes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from api_support import DECOMMISSION, Api, running_api
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from orquestador.domain.flow_definition import FlowDefinition
from orquestador.queue.acceptance import queue_execution

# What the review's caller held: enough for a dry run and for real transitions.
ATTACKER_SCOPES = ["flows:admin", "requests:write"]


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _finished_dry_run(api: Api, owner_engine: Engine) -> str:
    """A dry run's request whose simulated execution has ended: free for a transition."""
    flow_id = api.publish()["id"]
    started = api.post(
        f"/flows/{flow_id}/dry-runs",
        {"data": {"machineId": "m-7"}, "transition": "power-off"},
        scopes=ATTACKER_SCOPES,
    )
    assert started.status_code == 202, started.get_data(as_text=True)
    body = started.get_json()
    with owner_engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = 'SUCCEEDED', finished_at = now() WHERE id = :id"),
            {"id": body["executionId"]},
        )
        connection.execute(
            text("UPDATE request SET busy_execution_id = NULL WHERE id = :id"),
            {"id": body["requestId"]},
        )
    return body["requestId"]


def _written(engine: Engine, request_id: str) -> tuple:
    with engine.connect() as connection:
        return (
            connection.execute(
                text("SELECT revision, state FROM request WHERE id = :id"), {"id": request_id}
            ).one(),
            connection.execute(
                text("SELECT id, simulation FROM execution WHERE request_id = :id ORDER BY id"),
                {"id": request_id},
            ).all(),
            connection.execute(
                text("SELECT count(*) FROM audit_event WHERE request_id = :id"),
                {"id": request_id},
            ).scalar_one(),
            connection.execute(text("SELECT count(*) FROM machine_command")).scalar_one(),
        )


def test_a_real_transition_on_a_simulated_request_answers_404_like_a_missing_one(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    simulated = _finished_dry_run(api, owner_engine)
    before = _written(runtime_engine, simulated)

    refused = api.transition(simulated, "power-off", 2, scopes=ATTACKER_SCOPES)
    missing = api.transition(str(uuid.uuid4()), "power-off", 2, scopes=ATTACKER_SCOPES)

    assert refused.status_code == 404, refused.get_data(as_text=True)
    assert refused.get_data() == missing.get_data()
    assert refused.headers["Content-Type"] == missing.headers["Content-Type"]
    # Nothing moved: no execution queued, no audit row, no command for the machine.
    assert _written(runtime_engine, simulated) == before


def test_the_simulated_request_stays_readable_and_a_real_one_still_moves(
    api: Api, owner_engine: Engine
) -> None:
    simulated = _finished_dry_run(api, owner_engine)
    assert api.get(f"/requests/{simulated}", scopes=["requests:read"]).status_code == 200
    real = api.create_request(api.publish()["id"])["id"]
    assert api.transition(real, "power-off", 1, scopes=ATTACKER_SCOPES).status_code == 202


@pytest.mark.parametrize("request_simulation", [True, False])
def test_the_schema_refuses_an_execution_of_the_other_kind(
    api: Api, runtime_engine: Engine, request_simulation: bool
) -> None:
    # Below the API, as any writer of the runtime role would queue it.
    flow_id = api.publish()["id"]
    with runtime_engine.begin() as connection:
        request_row = connection.execute(
            text(
                "INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,"
                " simulation) VALUES ('org-a', 'alice', :flow, 'new', '{}', 'alice', :simulation)"
                " RETURNING id, org_id, flow_id, state, revision, data"
            ),
            {"flow": flow_id, "simulation": request_simulation},
        ).one()
    with pytest.raises(IntegrityError) as raised, runtime_engine.begin() as connection:
        queue_execution(
            connection,
            request_row=request_row,
            definition=FlowDefinition.from_json(DECOMMISSION),
            transition_id="power-off",
            actor="alice",
            actor_snapshot={"sub": "alice"},
            max_attempts=3,
            simulation=not request_simulation,
        )
    assert getattr(raised.value.orig, "sqlstate", None) == "23503"  # foreign_key_violation
    with runtime_engine.begin() as connection:
        queue_execution(
            connection,
            request_row=request_row,
            definition=FlowDefinition.from_json(DECOMMISSION),
            transition_id="power-off",
            actor="alice",
            actor_snapshot={"sub": "alice"},
            max_attempts=3,
            simulation=request_simulation,
        )
