"""Tenants share schedules fairly: per-organization quotas checked at creation, and firing
rounds that take due schedules in turns across organizations."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from api_support import ORG, OTHER_ORG, Api, problem, running_api
from schedule_support import fires, make_due, publish, put
from sqlalchemy import Engine, text

from orquestador.automation.firing import fire_due_schedules


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, quota_schedules=3, schedule_min_seconds=60) as api:
        yield api


def _database_now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.scalar(text("SELECT clock_timestamp()"))


def test_an_organization_holds_at_most_its_quota_of_schedules(api: Api) -> None:
    flow_id = publish(api)
    for n in range(3):
        assert put(api, f"s-{n}", {"flowId": flow_id, "everySeconds": 600}).status_code == 201

    refused = put(api, "s-3", {"flowId": flow_id, "everySeconds": 600})

    assert refused.status_code == 422
    body = problem(refused)
    assert body["code"] == "QUOTA_EXCEEDED" and "schedules" in body["detail"]
    assert body["problems"][0]["message"] == "quota schedules: 3 of 3"
    # Putting one it holds again is no creation; another organization has its own quota.
    assert put(api, "s-0", {"flowId": flow_id, "everySeconds": 900}).status_code == 200
    other_flow = publish(api, org=OTHER_ORG)
    assert (
        put(api, "s-3", {"flowId": other_flow, "everySeconds": 600}, org=OTHER_ORG).status_code
        == 201
    )


def test_org_quotas_raises_one_organization_s_limits(database) -> None:
    overrides = json.dumps({ORG: {"schedules": 4, "scheduleMinSeconds": 5}})
    with running_api(database.runtime_dsn, quota_schedules=3, org_quotas=overrides) as api:
        flow_id = publish(api)
        for n in range(4):
            made = put(api, f"s-{n}", {"flowId": flow_id, "everySeconds": 5})
            assert made.status_code == 201, made.get_data(as_text=True)
        assert put(api, "s-4", {"flowId": flow_id, "everySeconds": 5}).status_code == 422


@pytest.mark.parametrize(
    ("timing", "path"),
    [
        ({"everySeconds": 59}, "/everySeconds"),
        ({"cron": "*/1 * * * *", "timezone": "UTC"}, None),  # a minute apart: allowed
    ],
)
def test_a_schedule_firing_more_often_than_the_minimum_is_refused(
    api: Api, timing: dict, path: str | None
) -> None:
    answer = put(api, "fast", {"flowId": publish(api), **timing})
    if path is None:
        assert answer.status_code == 201, answer.get_data(as_text=True)
        return
    assert answer.status_code == 422
    body = problem(answer)
    assert body["code"] == "QUOTA_EXCEEDED" and "scheduleMinSeconds" in body["detail"]
    assert [p["path"] for p in body["problems"]] == [path]


def test_a_cron_whose_smallest_gap_is_below_the_minimum_is_refused(database) -> None:
    with running_api(database.runtime_dsn, schedule_min_seconds=600) as api:
        flow_id = publish(api)
        # Hourly, but twice within five minutes each hour: its smallest gap is 300 s.
        bursty = put(api, "bursty", {"flowId": flow_id, "cron": "0,5 * * * *"})
        hourly = put(api, "hourly", {"flowId": flow_id, "cron": "0 * * * *"})

    assert bursty.status_code == 422 and problem(bursty)["problems"][0]["path"] == "/cron"
    assert hourly.status_code == 201


def test_one_organization_s_flood_never_pushes_another_s_schedule_out_of_a_round(
    database, runtime_engine: Engine, owner_engine: Engine
) -> None:
    with running_api(database.runtime_dsn, schedule_min_seconds=1) as api:
        flood_flow = publish(api)
        assert put(api, "flood-0", {"flowId": flood_flow, "everySeconds": 1}).status_code == 201
        quiet_flow = publish(api, org=OTHER_ORG)
        assert (
            put(api, "quiet", {"flowId": quiet_flow, "everySeconds": 2}, org=OTHER_ORG).status_code
            == 201
        )
    now = _database_now(runtime_engine)
    # A thousand of one organization's schedules, all due before the other's.
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, flow_trigger, flow_key,"
                " transition_id, every_seconds, timezone, data, catch_up, paused,"
                " next_fire_at, updated_by)"
                " SELECT org_id, 'flood-' || n, flow_id, flow_trigger, flow_key, transition_id,"
                " every_seconds, timezone, data, catch_up, paused, :early, updated_by"
                " FROM schedule, generate_series(1, 999) AS n WHERE id = 'flood-0'"
            ),
            {"early": now - timedelta(seconds=10)},
        )
    make_due(runtime_engine, "flood-0", now - timedelta(seconds=10))
    make_due(runtime_engine, "quiet", now - timedelta(seconds=1))

    fire_due_schedules(runtime_engine, max_attempts=3, batch_size=10, now=now)

    assert len(fires(runtime_engine, "quiet")) == 1, "the quiet organization waited its turn"


# --- transitions asked for, a token bucket per organization ------------------------------


def test_transitions_beyond_the_burst_are_429_with_retry_after_and_the_bucket_is_shared(
    database,
) -> None:
    limits = {"quota_transitions_per_second": 1, "quota_transitions_burst": 3}
    # Two apps stand for two API processes: one bucket in the database serves both.
    with (
        running_api(database.runtime_dsn, **limits) as first,
        running_api(database.runtime_dsn, **limits) as second,
    ):
        flow_id = first.publish()["id"]
        body = {"flow": flow_id, "transition": "power-off", "data": {"machineId": "m-1"}}
        started = time.monotonic()
        answers = [api.post("/runs", body) for api in (first, second) * 5]
        elapsed = time.monotonic() - started
        other = first.post("/runs", body, org=OTHER_ORG)

    statuses = [answer.status_code for answer in answers]
    assert statuses[:3] == [202, 202, 202]
    # The burst, then one a second whichever process is asked (a busy machine is slow).
    assert statuses.count(202) <= 3 + math.ceil(elapsed)
    refused = [answer for answer in answers if answer.status_code == 429]
    assert refused and set(statuses) == {202, 429}
    assert problem(refused[0])["code"] == "QUOTA_EXCEEDED"
    assert "transitionsPerSecond" in problem(refused[0])["detail"]
    assert 1 <= int(refused[0].headers["Retry-After"]) <= 2
    # Another organization draws on a bucket of its own (its flow is missing: 422).
    assert other.status_code == 422


def test_get_quotas_shows_each_limit_with_what_is_in_use(database) -> None:
    limits = {"quota_schedules": 5, "quota_transitions_per_second": 1}
    with running_api(database.runtime_dsn, **limits, quota_transitions_burst=200) as api:
        flow_id = publish(api)
        assert put(api, "s-1", {"flowId": flow_id, "everySeconds": 600}).status_code == 201
        data = {"scheduleId": "by-hand", "fireTime": "now", "data": {}}
        run = {"flow": flow_id, "transition": "run", "data": data}
        assert api.post("/runs", run, scopes=["requests:write"]).status_code == 202

        answer = api.get(f"/orgs/{ORG}/quotas", scopes=["plans:admin"])
        foreign = api.get(f"/orgs/{OTHER_ORG}/quotas", scopes=["plans:admin"])
        unscoped = api.get(f"/orgs/{ORG}/quotas", scopes=["requests:read"])

    assert answer.status_code == 200, answer.get_data(as_text=True)
    quotas = answer.get_json()["quotas"]
    assert quotas["schedules"] == {"limit": 5, "used": 1}
    assert quotas["scheduleMinSeconds"] == {"limit": 1}
    assert quotas["transitionsPerSecond"] == {"limit": 1}
    assert quotas["transitionsBurst"]["limit"] == 200
    assert quotas["transitionsBurst"]["used"] in (0, 1)  # one taken, refilled within a second
    assert quotas["bulkItems"] == {"limit": 100_000}
    assert foreign.status_code == 404 and unscoped.status_code == 403
