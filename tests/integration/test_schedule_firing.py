"""Firing schedules on a real PostgreSQL: once per fire time, catch-up after downtime, DST."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from api_support import Api, running_api
from prometheus_client import REGISTRY
from schedule_support import (
    executions_per_fire_time,
    fires,
    get,
    make_due,
    publish,
    put,
)
from sqlalchemy import Engine, select, text

from orquestador.automation.firing import fire_due_schedules, fire_once
from orquestador.db.schema import schedule
from orquestador.domain.schedule_times import Timing

MADRID = ZoneInfo("Europe/Madrid")


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _fire_all(engine: Engine, now: datetime | None = None) -> int:
    """Rounds until nothing more is due; how many rounds it took."""
    rounds = 1
    while fire_due_schedules(engine, max_attempts=3, now=now):
        rounds += 1
    return rounds


def _fires_counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("orquestador_schedule_fires_total", {"outcome": outcome}) or 0


def _database_now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.scalar(text("SELECT clock_timestamp()"))


def test_a_due_schedule_starts_its_flow_once_with_the_fire_data(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = publish(api)
    put(api, "tick", {"flowId": flow_id, "everySeconds": 600, "data": {"report": "r"}})
    due = _database_now(runtime_engine) - timedelta(seconds=1)
    make_due(runtime_engine, "tick", due)

    _fire_all(runtime_engine)
    _fire_all(runtime_engine)  # nothing more is due: a second pass starts nothing

    [(fire_time, request_id, execution_id)] = fires(runtime_engine, "tick")
    assert fire_time == due
    with runtime_engine.connect() as connection:
        request = connection.execute(
            text("SELECT owner_id, state, data, flow_id FROM request WHERE id = :id"),
            {"id": request_id},
        ).one()
        execution = connection.execute(
            text("SELECT status, transition_id, request_id FROM execution WHERE id = :id"),
            {"id": execution_id},
        ).one()
    assert request.owner_id == "alice" and str(request.flow_id) == flow_id
    assert request.data == {
        "scheduleId": "tick",
        "fireTime": due.astimezone(UTC).isoformat(),
        "data": {"report": "r"},
    }
    assert tuple(execution) == ("PENDING", "run", request_id)
    view = get(api, "/schedules/tick").get_json()
    assert datetime.fromisoformat(view["lastFiredAt"]) == due
    assert datetime.fromisoformat(view["nextFireAt"]) == due + timedelta(seconds=600)
    assert view["missed"] == 0


@pytest.mark.parametrize(
    ("policy", "late", "started", "missed"),
    [
        # Six hourly fire times passed; the latest is two minutes late.
        ("skip", 120, 0, 6),
        ("one", 120, 1, 5),
        ("all", 120, 6, 0),
        # The latest is ten seconds late: on time, so skip starts it.
        ("skip", 10, 1, 5),
    ],
)
def test_after_downtime_the_catch_up_policy_applies_and_misses_are_visible(
    api: Api, runtime_engine: Engine, policy: str, late: int, started: int, missed: int
) -> None:
    put(api, "hourly", {"flowId": publish(api), "everySeconds": 3600, "catchUp": policy})
    now = _database_now(runtime_engine)
    first = now - timedelta(hours=5, seconds=late)
    make_due(runtime_engine, "hourly", first)
    counted_before = {outcome: _fires_counted(outcome) for outcome in ("started", "missed")}

    _fire_all(runtime_engine)

    handled = fires(runtime_engine, "hourly")
    assert len(handled) == started
    assert all(execution_id is not None for _, _, execution_id in handled)
    latest = first + timedelta(hours=5)
    if policy != "all":
        assert [t for t, _, _ in handled] == ([latest] if started else [])
    view = get(api, "/schedules/hourly").get_json()
    assert view["missed"] == missed
    assert _fires_counted("started") - counted_before["started"] == started
    assert _fires_counted("missed") - counted_before["missed"] == missed
    assert datetime.fromisoformat(view["nextFireAt"]) == latest + timedelta(hours=1)
    if started:
        assert datetime.fromisoformat(view["lastFiredAt"]) == latest
    else:
        assert view["lastFiredAt"] is None


def test_catching_up_all_goes_in_short_rounds(api: Api, runtime_engine: Engine) -> None:
    put(api, "m", {"flowId": publish(api), "everySeconds": 60, "catchUp": "all"})
    now = _database_now(runtime_engine)
    make_due(runtime_engine, "m", now - timedelta(minutes=44, seconds=30))

    rounds = _fire_all(runtime_engine)

    assert len(fires(runtime_engine, "m")) == 45
    assert rounds == 3  # 20 fires a round at most
    assert set(executions_per_fire_time(runtime_engine, "m").values()) == {1}


def test_a_fire_time_already_handled_never_starts_a_second_execution(
    api: Api, runtime_engine: Engine
) -> None:
    put(api, "tick", {"flowId": publish(api), "everySeconds": 600})
    due = _database_now(runtime_engine) - timedelta(seconds=1)
    make_due(runtime_engine, "tick", due)
    _fire_all(runtime_engine)
    # Whatever puts the schedule back on a fire time it has handled (an operator's
    # repair, a restored backup), the fire row's key keeps the first execution the only one.
    make_due(runtime_engine, "tick", due)
    _fire_all(runtime_engine)

    assert len(fires(runtime_engine, "tick")) == 1
    assert executions_per_fire_time(runtime_engine, "tick") == {due.astimezone(UTC).isoformat(): 1}


def test_two_transactions_firing_one_fire_time_at_once_start_one_execution(
    api: Api, runtime_engine: Engine
) -> None:
    put(api, "tick", {"flowId": publish(api), "everySeconds": 600})
    fire_time = _database_now(runtime_engine).replace(microsecond=0)
    with runtime_engine.connect() as connection:
        row = connection.execute(select(schedule).where(schedule.c.id == "tick")).one()
    timing = Timing(None, 600, "UTC")
    barrier = threading.Barrier(2)
    started: list[str | None] = []

    def fire() -> None:
        # Neither holds the schedule's row lock: only the fire row's key stands between them.
        with runtime_engine.begin() as connection:
            barrier.wait(10)
            started.append(fire_once(connection, row, timing, fire_time, 3))

    threads = [threading.Thread(target=fire) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(started, key=str) == [None, "started"]
    assert len(fires(runtime_engine, "tick")) == 1
    assert list(executions_per_fire_time(runtime_engine, "tick").values()) == [1]


def test_a_paused_schedule_never_fires(api: Api, runtime_engine: Engine) -> None:
    body = {"flowId": publish(api), "everySeconds": 1, "paused": True}
    put(api, "p", body)
    with runtime_engine.begin() as connection:
        connection.execute(
            text("UPDATE schedule SET next_fire_at = clock_timestamp() - interval '1 hour'")
        )

    _fire_all(runtime_engine)

    assert fires(runtime_engine, "p") == []


def test_a_schedule_that_cannot_be_fired_is_set_aside_and_the_others_fire(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    flow_id = publish(api)
    put(api, "broken", {"flowId": flow_id, "everySeconds": 60})
    put(api, "fine", {"flowId": flow_id, "everySeconds": 60})
    due = _database_now(runtime_engine) - timedelta(seconds=1)
    make_due(runtime_engine, "broken", due - timedelta(seconds=1))  # first in line
    make_due(runtime_engine, "fine", due)
    # A time zone this machine no longer knows: the schedule's round fails on its own.
    with owner_engine.begin() as connection:
        connection.execute(text("UPDATE schedule SET timezone = 'Gone/Away' WHERE id = 'broken'"))

    _fire_all(runtime_engine)

    assert len(fires(runtime_engine, "fine")) == 1
    assert fires(runtime_engine, "broken") == []
    with runtime_engine.connect() as connection:
        broken = connection.execute(
            text("SELECT next_fire_at, retry_at FROM schedule WHERE id = 'broken'")
        ).one()
    # Its fire time is kept, only put off: fixed, it fires that same fire time.
    assert broken.next_fire_at == due - timedelta(seconds=1)
    assert broken.retry_at > due + timedelta(seconds=50)
    put(api, "broken", {"flowId": flow_id, "everySeconds": 60, "data": {"report": "x"}})
    with runtime_engine.connect() as connection:
        retry_at = connection.execute(
            text("SELECT retry_at FROM schedule WHERE id = 'broken'")
        ).scalar_one()
    assert retry_at is None


def test_a_fire_the_flow_refuses_is_kept_without_an_execution_and_audited(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    put(api, "tick", {"flowId": publish(api), "everySeconds": 60})
    due = _database_now(runtime_engine) - timedelta(seconds=1)
    make_due(runtime_engine, "tick", due)
    # Data the flow's dataSchema refuses, written behind the API's back.
    with owner_engine.begin() as connection:
        connection.execute(text("""UPDATE schedule SET data = '{"report": 5}' WHERE id = 'tick'"""))
    refused_before = _fires_counted("refused")

    _fire_all(runtime_engine)

    assert fires(runtime_engine, "tick") == [(due, None, None)]
    assert executions_per_fire_time(runtime_engine, "tick") == {}
    with runtime_engine.connect() as connection:
        detail = connection.execute(
            text("SELECT detail FROM audit_event WHERE kind = 'SCHEDULE_FIRE_REJECTED'")
        ).scalar_one()
    assert detail["scheduleId"] == "tick"
    assert [p["path"] for p in detail["problems"]] == ["/data/report"]
    assert _fires_counted("refused") - refused_before == 1
    assert get(api, "/schedules/tick").get_json()["lastFiredAt"] is None


def _madrid_fires(engine: Engine, schedule_id: str) -> list[str]:
    return sorted(executions_per_fire_time(engine, schedule_id))


def test_spring_forward_in_madrid_a_daily_0230_fires_at_0300_that_day(
    api: Api, runtime_engine: Engine
) -> None:
    """29 March 2026: Madrid's clocks go from 02:00 to 03:00; 02:30 does not exist that night."""
    body = {"flowId": publish(api), "cron": "30 2 * * *", "timezone": "Europe/Madrid"}
    put(api, "nightly", {**body, "catchUp": "all"})
    make_due(runtime_engine, "nightly", datetime(2026, 3, 28, 2, 30, tzinfo=MADRID))

    _fire_all(runtime_engine, now=datetime(2026, 3, 30, 12, 0, tzinfo=MADRID))

    assert _madrid_fires(runtime_engine, "nightly") == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    view = get(api, "/schedules/nightly").get_json()
    assert view["nextFireAt"] == "2026-03-31T00:30:00Z"  # 02:30 summer time
    assert view["lastFiredAt"] == "2026-03-30T00:30:00Z" and view["missed"] == 0


def test_fall_back_in_madrid_a_daily_0230_fires_once_and_0130_keeps_its_time(
    api: Api, runtime_engine: Engine
) -> None:
    """25 October 2026: Madrid's clocks go from 03:00 back to 02:00; 02:30 happens twice.

    A daily 02:30 fires once that night, at the first 02:30 (summer time). 01:30 is not
    in the repeated hour in Madrid: it fires at 01:30 each day, 25 hours apart across
    the change.
    """
    flow_id = publish(api)
    for name, cron in (("at-0230", "30 2 * * *"), ("at-0130", "30 1 * * *")):
        body = {"flowId": flow_id, "cron": cron, "timezone": "Europe/Madrid", "catchUp": "all"}
        put(api, name, body)
        hour = int(cron.split()[1])
        make_due(runtime_engine, name, datetime(2026, 10, 24, hour, 30, tzinfo=MADRID))

    _fire_all(runtime_engine, now=datetime(2026, 10, 26, 12, 0, tzinfo=MADRID))

    assert _madrid_fires(runtime_engine, "at-0230") == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    assert _madrid_fires(runtime_engine, "at-0130") == [
        "2026-10-24T01:30:00+02:00",
        "2026-10-25T01:30:00+02:00",
        "2026-10-26T01:30:00+01:00",
    ]
    handled = [t for t, _, _ in fires(runtime_engine, "at-0130")]
    assert handled[2] - handled[1] == timedelta(hours=25)


def test_every_half_hour_fires_on_both_passes_of_the_repeated_hour(
    api: Api, runtime_engine: Engine
) -> None:
    body = {"flowId": publish(api), "cron": "*/30 * * * *", "timezone": "Europe/Madrid"}
    put(api, "half", {**body, "catchUp": "all"})
    make_due(runtime_engine, "half", datetime(2026, 10, 25, 1, 30, tzinfo=MADRID))

    _fire_all(runtime_engine, now=datetime(2026, 10, 25, 3, 10, tzinfo=MADRID, fold=1))

    assert _madrid_fires(runtime_engine, "half") == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T03:00:00+01:00",
    ]
