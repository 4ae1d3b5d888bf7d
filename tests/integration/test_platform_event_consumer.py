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
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy.exc import DBAPIError
from worker_support import registry_of, settings, wait_until

from orquestador.automation.consumer import PlatformEventConsumer, consume_platform_events
from orquestador.automation.events import Actor, claim_unprocessed, process_event
from orquestador.db.engine import make_engine
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
                json={"id": "e-race", "moment": "provisioned", "planId": "vps", "machineId": "m-1"},
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


def _insert_raw(engine: Engine, *events: tuple[str, str, str]) -> None:
    """Rows whose data is JSON text as the platform wrote it (Python cannot build all of it)."""
    with engine.begin() as connection:
        for event_id, plan, data in events:
            connection.execute(
                text(
                    "INSERT INTO platform_event (org_id, id, moment, plan_id, machine_id, data)"
                    " VALUES (:org, :id, 'provisioned', :plan, 'm-1', CAST(:data AS jsonb))"
                ),
                {"org": ORG, "id": event_id, "plan": plan, "data": data},
            )


def _asked(api: Api, event_id: str, plan: str = "vps") -> Any:
    """What the platform hears when it asks about an event it inserted."""
    response = api.client().post(
        "/api/v1/events",
        json={"id": event_id, "moment": "provisioned", "planId": plan, "machineId": "m-1"},
        headers=api.headers(scopes=AUTOMATION_SCOPES),
    )
    assert response.status_code in (200, 202), response.get_data(as_text=True)
    return response.get_json()


def _started_event_ids(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT request.data -> 'event' ->> 'id' FROM execution"
                    " JOIN request ON request.id = execution.request_id"
                )
            ).scalars()
        )


@pytest.mark.parametrize(
    "data, reason",
    [
        # PostgreSQL stores it; Python's JSON reader gives up a thousand levels down.
        ('{"deep": ' + "[" * 10_000 + "]" * 10_000 + "}", "nests deeper than 64 levels"),
        # PostgreSQL stores it; Python reads integers of at most 4300 digits.
        ('{"n": 1' + "0" * 5_000 + "}", "digits"),
        # Far more than the request data may hold: refused before it is read.
        ('{"blob": "' + "x" * 1_100_000 + '"}', "bytes"),
    ],
    ids=["nested-10000-deep", "number-of-5000-digits", "over-a-mebibyte"],
)
def test_a_poison_event_is_rejected_with_why_and_the_event_behind_it_starts_in_the_same_round(
    api: Api, runtime_engine: Engine, data: str, reason: str
) -> None:
    _bind(api)
    _insert_raw(
        runtime_engine,
        ("e-poison", "vps", data),
        ("e-good", "vps", '{"hostname": "web-1"}'),
    )

    assert consume_platform_events(runtime_engine, max_attempts=3) == 2

    assert _started_event_ids(runtime_engine) == ["e-good"]
    assert count(runtime_engine, "request") == 1
    good = _asked(api, "e-good")
    assert good["eventId"] == "e-good" and "executionId" in good
    poison = _asked(api, "e-poison")
    assert (poison["started"], poison["reason"]) == (False, "REJECTED")
    [problem] = poison["problems"]
    assert problem["path"] == "/event/data"
    assert reason in problem["message"]
    assert consume_platform_events(runtime_engine, max_attempts=3) == 0
    assert count(runtime_engine, "execution") == 1


def test_a_nul_character_cannot_reach_the_consumer(api: Api, runtime_engine: Engine) -> None:
    # jsonb has no NUL character: PostgreSQL refuses the platform's insert itself, so its
    # transaction fails and no row exists to poison a round.
    _bind(api)
    for data in ('{"hostname": "web\\u0000"}', '{"host\\u0000name": "web-1"}'):
        with pytest.raises(DBAPIError, match="u0000"):
            _insert_raw(runtime_engine, ("e-nul", "vps", data))
    _insert_raw(runtime_engine, ("e-good", "vps", '{"hostname": "web-1"}'))

    assert consume_platform_events(runtime_engine, max_attempts=3) == 1
    assert _started_event_ids(runtime_engine) == ["e-good"]


def test_an_event_whose_processing_fails_unexpectedly_is_rejected_and_the_rest_go_on(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    broken = _bind(api, plan="broken")
    _bind(api, plan="vps")
    with owner_engine.begin() as connection:
        # A stored flow that no longer reads as one (a defect, a hand edit): building it
        # fails in the middle of the event's processing, not in the database.
        connection.execute(
            text("UPDATE flow SET definition = definition - 'states' WHERE id = :id"),
            {"id": broken},
        )
    _insert_raw(
        runtime_engine,
        ("e-broken", "broken", '{"hostname": "web-1"}'),
        ("e-good", "vps", '{"hostname": "web-2"}'),
    )

    assert consume_platform_events(runtime_engine, max_attempts=3) == 2

    assert _started_event_ids(runtime_engine) == ["e-good"]
    assert count(runtime_engine, "request") == 1
    rejected = _asked(api, "e-broken", plan="broken")
    assert (rejected["started"], rejected["reason"]) == (False, "REJECTED")
    [problem] = rejected["problems"]
    assert "could not be processed" in problem["message"]
    assert consume_platform_events(runtime_engine, max_attempts=3) == 0


@pytest.mark.parametrize(
    "interruption",
    [
        # The database went away: the round's connection is gone.
        "pg_terminate_backend(:pid, 10000)",
        # A passing failure the connection survives (as a statement timeout): recording
        # the event REJECTED here would be wrong, and the round could still commit.
        "pg_cancel_backend(:pid)",
    ],
    ids=["connection-lost", "statement-cancelled"],
)
def test_a_passing_database_failure_mid_round_leaves_every_event_for_the_next_round(
    api: Api, runtime_engine: Engine, owner_engine: Engine, interruption: str
) -> None:
    _bind(api)
    _insert_events(runtime_engine, {"id": "e-none", "moment": "deleted"}, {"id": "e-start"})
    failures: list[BaseException] = []

    def one_round() -> None:
        try:
            consume_platform_events(runtime_engine, max_attempts=3)
        except BaseException as exc:  # the round's own failure is what this test reads
            failures.append(exc)

    with owner_engine.connect() as blocker:
        # The round records e-none, then waits to insert e-start's request: the moment to
        # take its connection away.
        blocker.execute(text("LOCK TABLE request IN SHARE ROW EXCLUSIVE MODE"))
        consumer = threading.Thread(target=one_round)
        consumer.start()
        waiting = wait_until(lambda: _lock_waiter(runtime_engine), what="the round waits")
        with owner_engine.connect() as killer:
            killer.execute(text(f"SELECT {interruption}"), {"pid": waiting})
        consumer.join(timeout=30)
        blocker.rollback()

    assert [type(failure).__name__ for failure in failures] == ["OperationalError"]
    assert _outcomes(runtime_engine) == {"e-none": (None, None), "e-start": (None, None)}
    assert consume_platform_events(runtime_engine, max_attempts=3) == 2
    outcomes = _outcomes(runtime_engine)
    assert outcomes["e-none"] == ("NO_BINDING", None)
    assert outcomes["e-start"][0] == "STARTED"
    assert _started_event_ids(runtime_engine) == ["e-start"]


def test_a_lock_timeout_mid_round_leaves_every_event_for_the_next_round(
    api: Api, database: Any, runtime_engine: Engine, owner_engine: Engine
) -> None:
    _bind(api)
    _insert_events(runtime_engine, {"id": "e-none", "moment": "deleted"}, {"id": "e-start"})
    impatient = make_engine(database.runtime_dsn)

    @sqlalchemy_event.listens_for(impatient, "connect")
    def _lock_timeout(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("SET lock_timeout = '100ms'")
        dbapi_connection.commit()

    try:
        with owner_engine.connect() as blocker:
            # Someone holds a lock e-start's request needs for longer than the round waits:
            # that says nothing about the event, which must not be set aside for it.
            blocker.execute(text("LOCK TABLE request IN SHARE ROW EXCLUSIVE MODE"))
            with pytest.raises(DBAPIError, match="lock timeout"):
                consume_platform_events(impatient, max_attempts=3)
            blocker.rollback()
    finally:
        impatient.dispose()

    assert _outcomes(runtime_engine) == {"e-none": (None, None), "e-start": (None, None)}
    assert consume_platform_events(runtime_engine, max_attempts=3) == 2
    assert _outcomes(runtime_engine)["e-start"][0] == "STARTED"
    assert _started_event_ids(runtime_engine) == ["e-start"]


def _lock_waiter(engine: Engine) -> int | None:
    with engine.connect() as connection:
        return connection.execute(
            text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one_or_none()
