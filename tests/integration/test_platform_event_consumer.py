"""The worker's consumer of platform_event rows: each becomes its request and execution once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import Api, running_api
from automation_support import AUTOMATION_SCOPES, count, moment_flow
from sqlalchemy import Engine, text
from worker_support import registry_of, settings, wait_until

from orquestador.automation.consumer import PlatformEventConsumer, consume_platform_events
from orquestador.automation.events import Actor, claim_unprocessed, process_event
from orquestador.worker.background import background_loops
from orquestador.worker.daemon import Worker

ORG = "org-a"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _bind(api: Api, plan: str = "vps") -> str:
    headers = api.headers(scopes=AUTOMATION_SCOPES)
    api.client().put(f"/api/v1/plans/{plan}", json={"name": plan}, headers=headers)
    flow_id = api.publish(moment_flow(), scopes=AUTOMATION_SCOPES)["id"]
    bound = api.client().put(
        f"/api/v1/plans/{plan}/bindings/provisioned", json={"flowId": flow_id}, headers=headers
    )
    assert bound.status_code == 200
    return flow_id


def _insert_events(engine: Engine, *events: dict[str, Any]) -> None:
    """As the platform does, in its own transaction (its role may only insert)."""
    with engine.begin() as connection:
        for event in events:
            connection.execute(
                text(
                    "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, data)"
                    " VALUES (:org, :id, :moment, :plan, :machine, CAST(:data AS jsonb))"
                ),
                {
                    "org": ORG,
                    "moment": "provisioned",
                    "plan": "vps",
                    "machine": "m-1",
                    **event,
                    "data": json.dumps(event.get("data", {})),
                },
            )


def _outcomes(engine: Engine) -> dict[str, Any]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, outcome, execution_id FROM platform_event"))
        return {row.id: (row.outcome, row.execution_id) for row in rows}


def test_inserted_events_are_started_recorded_or_rejected(api: Api, runtime_engine: Engine) -> None:
    flow_id = _bind(api)
    _insert_events(
        runtime_engine,
        {"id": "e-start", "machine": "m-9", "data": {"hostname": "web-9"}},
        {"id": "e-none", "moment": "deleted"},
        {"id": "e-bad", "data": {"hostname": 7}},
    )

    assert consume_platform_events(runtime_engine, max_attempts=5) == 3
    assert consume_platform_events(runtime_engine, max_attempts=5) == 0

    outcomes = _outcomes(runtime_engine)
    assert outcomes["e-none"] == ("NO_BINDING", None)
    assert outcomes["e-bad"] == ("REJECTED", None)
    assert outcomes["e-start"][0] == "STARTED"
    with runtime_engine.connect() as connection:
        request = connection.execute(text("SELECT * FROM request")).one()
        execution = connection.execute(text("SELECT * FROM execution")).one()
    assert execution.id == outcomes["e-start"][1]
    assert (str(request.flow_id), request.machine_id, request.owner_id) == (
        flow_id,
        "m-9",
        "platform",
    )
    assert request.data["event"]["id"] == "e-start"
    assert request.data["event"]["data"] == {"hostname": "web-9"}
    # Without occurredAt, the event happened when it was received.
    assert request.data["event"]["occurredAt"].startswith("20")
    assert (execution.transition_id, execution.max_attempts) == ("greet", 5)
    assert execution.actor_snapshot == {"sub": "platform", "org": ORG, "scopes": []}

    # The platform asking through the API later gets what the consumer recorded.
    answer = api.client().post(
        "/api/v1/events",
        json={"id": "e-bad", "moment": "provisioned", "planId": "vps", "machineId": "m-1"},
        headers=api.headers(scopes=AUTOMATION_SCOPES),
    )
    assert answer.status_code == 200
    assert answer.get_json()["reason"] == "REJECTED"
    assert [p["path"] for p in answer.get_json()["problems"]] == ["/event/data/hostname"]


def test_consumers_skip_the_rows_another_holds_and_each_event_starts_once(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)
    _insert_events(runtime_engine, *({"id": f"e-{n:02d}"} for n in range(30)))

    # A consumer mid-batch holds ten rows; another, meanwhile, takes only the rest.
    with runtime_engine.begin() as held:
        claimed = claim_unprocessed(held, 10)
        assert len(claimed) == 10
        assert consume_platform_events(runtime_engine, max_attempts=3, batch_size=50) == 20
        assert consume_platform_events(runtime_engine, max_attempts=3) == 0
        for event in claimed:
            process_event(held, event, Actor.platform(ORG), max_attempts=3)
    assert consume_platform_events(runtime_engine, max_attempts=3) == 0

    outcomes = _outcomes(runtime_engine)
    assert {outcome for outcome, _ in outcomes.values()} == {"STARTED"}
    assert len({execution for _, execution in outcomes.values()}) == 30
    assert count(runtime_engine, "execution") == 30
    assert count(runtime_engine, "request") == 30


def test_post_events_waits_for_a_consumer_holding_the_row_and_answers_its_outcome(
    api: Api, runtime_engine: Engine
) -> None:
    _bind(api)
    _insert_events(runtime_engine, {"id": "e-race"})
    answers: list[Any] = []

    with runtime_engine.begin() as held:
        [event] = claim_unprocessed(held, 10)

        def deliver() -> None:
            response = api.client().post(
                "/api/v1/events",
                json={"id": "e-race", "moment": "provisioned", "planId": "vps", "machineId": "x"},
                headers=api.headers(scopes=AUTOMATION_SCOPES),
            )
            answers.append((response.status_code, response.get_json()))

        delivery = threading.Thread(target=deliver)
        delivery.start()
        wait_until(lambda: _waiting_on_a_lock(runtime_engine), what="POST waiting on the row")
        started = process_event(held, event, Actor.platform(ORG), max_attempts=3)
    delivery.join(timeout=30)

    assert answers == [
        (
            202,
            {
                "eventId": "e-race",
                "requestId": str(started.request_id),
                "executionId": str(started.execution_id),
            },
        )
    ]
    assert count(runtime_engine, "execution") == 1


def _waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        return bool(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_worker_runs_the_flow_an_inserted_event_started(api: Api, runtime_engine: Engine) -> None:
    _bind(api)
    worker = Worker(settings(), runtime_engine, registry_of())
    consumer = PlatformEventConsumer(runtime_engine, max_attempts=3, interval_seconds=0.05)
    worker.start()
    consumer.start()
    try:
        _insert_events(runtime_engine, {"id": "e-live", "machine": "m-live"})
        wait_until(
            lambda: _outcomes(runtime_engine).get("e-live", (None,))[0] == "STARTED",
            what="the consumer started the event",
        )
        execution_id = _outcomes(runtime_engine)["e-live"][1]
        seen = api.client().get(
            f"/api/v1/executions/{execution_id}", headers=api.headers(scopes=["requests:read-all"])
        )
        wait_until(
            lambda: _status(runtime_engine, execution_id) == "SUCCEEDED", what="flow finished"
        )
    finally:
        consumer.stop()
        consumer.join(timeout=10)
        worker.stop(timeout=30)
    assert seen.status_code == 200
    with runtime_engine.connect() as connection:
        request = connection.execute(text("SELECT state, machine_id FROM request")).one()
    assert tuple(request) == ("greeted", "m-live")


def _status(engine: Engine, execution_id: Any) -> str:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT status FROM execution WHERE id = :id"), {"id": execution_id}
        ).scalar_one()


def test_every_worker_runs_the_consumer(runtime_engine: Engine) -> None:
    loops = background_loops(settings(execution_max_attempts=7), runtime_engine, "w1")
    [loop] = [loop for loop in loops if isinstance(loop, PlatformEventConsumer)]
    assert isinstance(loop, PlatformEventConsumer)
    assert loop.max_attempts == 7
    assert loop.interval_seconds <= 1.0


def test_a_batch_cut_off_midway_leaves_nothing_and_the_next_round_starts_each_once(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    _bind(api)
    _insert_events(runtime_engine, *({"id": f"e-{n}"} for n in range(5)))
    # A consumer that processed three of its five events when its connection died (a
    # worker killed, the database restarted): its transaction never committed.
    doomed = runtime_engine.connect()
    doomed.begin()
    claimed = claim_unprocessed(doomed, 5)
    for event in claimed[:3]:
        process_event(doomed, event, Actor.platform(ORG), max_attempts=3)
    pid = doomed.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with owner_engine.connect() as killer:
        # With a timeout it returns once the backend is gone and its locks released.
        gone = killer.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
        assert gone.scalar_one() is True
    doomed.invalidate()
    doomed.close()

    assert count(runtime_engine, "execution") == 0
    assert consume_platform_events(runtime_engine, max_attempts=3) == 5
    assert count(runtime_engine, "execution") == 5
    assert count(runtime_engine, "request") == 5
    assert {outcome for outcome, _ in _outcomes(runtime_engine).values()} == {"STARTED"}
