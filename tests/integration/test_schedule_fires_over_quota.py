"""A schedule's fire over the organization's quota openExecutions is put off, then missed
once the schedule's following fire time passes; on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from api_support import ORG, OTHER_ORG, Api, running_api
from prometheus_client import REGISTRY
from schedule_support import fires, get, make_due, publish, put
from sqlalchemy import Engine, text

from orquestador.automation.firing import QUOTA_RETRY_AFTER, fire_due_schedules

PERIOD = timedelta(seconds=10)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _one_open_each(org: str) -> int:
    return 1


def _round(engine: Engine, now: datetime) -> None:
    fire_due_schedules(engine, max_attempts=3, now=now, open_limit=_one_open_each)


def _missed_counted() -> float:
    found = REGISTRY.get_sample_value("orquestador_schedule_fires_total", {"outcome": "missed"})
    return found or 0.0


def _schedule(engine: Engine, schedule_id: str):
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT next_fire_at, retry_at, missed FROM schedule WHERE id = :id"),
            {"id": schedule_id},
        ).one()


def _end_every_execution(owner_engine: Engine, org: str = ORG) -> None:
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE execution SET status = 'SUCCEEDED', finished_at = now()"
                " WHERE org_id = :org AND status = 'PENDING'"
            ),
            {"org": org},
        )


def _started_at(engine: Engine, api: Api, catch_up: str = "skip") -> datetime:
    """The schedule `tick` of every PERIOD, fired once at t0: the organization's one open
    execution is its own."""
    body = {"flowId": publish(api), "everySeconds": 10, "catchUp": catch_up}
    assert put(api, "tick", body).status_code == 201
    with engine.connect() as connection:
        t0 = connection.scalar(text("SELECT date_trunc('second', clock_timestamp())"))
    make_due(engine, "tick", t0)
    _round(engine, t0 + timedelta(seconds=0.5))
    assert [fire[0] for fire in fires(engine, "tick")] == [t0]
    return t0


def test_a_fire_over_the_quota_waits_and_starts_once_an_execution_ends(
    api: Api, runtime_engine: Engine, owner_engine: Engine
) -> None:
    t0 = _started_at(runtime_engine, api)
    other_flow = publish(api, org=OTHER_ORG)
    assert put(api, "other", {"flowId": other_flow, "everySeconds": 10}, org=OTHER_ORG)
    make_due(runtime_engine, "other", t0 + PERIOD)

    at = t0 + PERIOD + timedelta(seconds=0.5)
    _round(runtime_engine, at)

    held = _schedule(runtime_engine, "tick")
    assert (held.next_fire_at, held.retry_at, held.missed) == (
        t0 + PERIOD,
        at + QUOTA_RETRY_AFTER,
        0,
    )
    assert len(fires(runtime_engine, "tick")) == 1
    # Another organization's quota is its own: its schedule fired in the same round.
    assert [fire[0] for fire in fires(runtime_engine, "other")] == [t0 + PERIOD]
    # Put off: not looked at again before its retry.
    _end_every_execution(owner_engine)
    _round(runtime_engine, at + QUOTA_RETRY_AFTER / 2)
    assert len(fires(runtime_engine, "tick")) == 1

    _round(runtime_engine, at + QUOTA_RETRY_AFTER)

    assert [fire[0] for fire in fires(runtime_engine, "tick")] == [t0, t0 + PERIOD]
    after = _schedule(runtime_engine, "tick")
    assert (after.next_fire_at, after.retry_at, after.missed) == (t0 + 2 * PERIOD, None, 0)


@pytest.mark.parametrize("catch_up", ["skip", "one", "all"])
def test_a_fire_still_over_the_quota_when_the_next_one_comes_is_missed(
    api: Api, runtime_engine: Engine, owner_engine: Engine, catch_up: str
) -> None:
    t0 = _started_at(runtime_engine, api, catch_up)
    _round(runtime_engine, t0 + PERIOD + timedelta(seconds=0.5))
    missed_before = _missed_counted()

    # Still over the quota once the following fire time has passed.
    _round(runtime_engine, t0 + 2 * PERIOD + timedelta(seconds=0.5))

    held = _schedule(runtime_engine, "tick")
    assert (held.next_fire_at, held.missed) == (t0 + 2 * PERIOD, 1)
    assert _missed_counted() == missed_before + 1
    assert get(api, "/schedules/tick").get_json()["missed"] == 1
    # The held one starts once there is room; the missed one never does.
    _end_every_execution(owner_engine)
    _round(runtime_engine, t0 + 2 * PERIOD + timedelta(seconds=6))
    assert [fire[0] for fire in fires(runtime_engine, "tick")] == [t0, t0 + 2 * PERIOD]
