"""PUT, GET, list and DELETE of schedules: bodies checked, refusals as problems, org-scoped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from automation_support import count
from schedule_support import get, make_due, publish, put, schedule_flow, who
from sqlalchemy import Engine


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_a_cron_schedule_is_created_and_read_back(api: Api) -> None:
    flow_id = publish(api)
    body = {
        "flowId": flow_id,
        "cron": "30 2 * * *",
        "timezone": "Europe/Madrid",
        "data": {"report": "nightly"},
        "catchUp": "one",
    }
    created = put(api, "nightly", body)

    assert created.status_code == 201, created.get_data(as_text=True)
    assert created.headers["Location"] == "/api/v1/schedules/nightly"
    view = created.get_json()
    assert {k: view[k] for k in body} == body
    assert view["id"] == "nightly" and view["paused"] is False
    assert view["lastFiredAt"] is None and view["missed"] == 0
    # December: no daylight-saving change is near, 02:30 on Madrid's clock.
    next_fire = _instant(view["nextFireAt"]).astimezone(ZoneInfo("Europe/Madrid"))
    assert (next_fire.hour, next_fire.minute) == (2, 30)
    assert get(api, "/schedules/nightly").get_json() == view


def test_a_period_schedule_fires_first_one_period_after_it_is_put(api: Api) -> None:
    flow_id = publish(api)
    before = datetime.now(UTC)
    view = put(api, "often", {"flowId": flow_id, "everySeconds": 3600}).get_json()

    assert view["everySeconds"] == 3600 and "cron" not in view
    assert view["timezone"] == "UTC" and view["catchUp"] == "skip" and view["data"] == {}
    next_fire = _instant(view["nextFireAt"])
    assert before + timedelta(seconds=3590) < next_fire < before + timedelta(seconds=3700)


def test_putting_again_keeps_the_next_fire_time_unless_the_timing_or_pause_changes(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = publish(api)
    body = {"flowId": flow_id, "cron": "0 4 * * *"}
    put(api, "s", body)
    # Due and not fired yet: a put that changes only the data must not skip it.
    due = datetime(2026, 1, 1, 4, tzinfo=UTC)
    make_due(runtime_engine, "s", due)

    again = put(api, "s", {**body, "data": {"report": "x"}})
    assert again.status_code == 200
    assert datetime.fromisoformat(again.get_json()["nextFireAt"]) == due
    assert again.get_json()["data"] == {"report": "x"}

    paused = put(api, "s", {**body, "paused": True}).get_json()
    assert paused["paused"] is True and paused["nextFireAt"] is None

    resumed = put(api, "s", body).get_json()
    assert _instant(resumed["nextFireAt"]) > datetime.now(UTC)

    moved = put(api, "s", {**body, "cron": "0 5 * * *"}).get_json()
    assert _instant(moved["nextFireAt"]).hour == 5


@pytest.mark.parametrize(
    ("change", "code", "paths"),
    [
        ({"cron": "* * * *"}, "SCHEDULE_INVALID", ["/cron"]),
        ({"cron": "0 0 * * * *"}, "SCHEDULE_INVALID", ["/cron"]),
        ({"cron": "61 * * * *"}, "SCHEDULE_INVALID", ["/cron"]),
        ({"cron": "0 0 31 2 *"}, "SCHEDULE_INVALID", ["/cron"]),
        ({"cron": "* * * * *", "everySeconds": 60}, "SCHEDULE_INVALID", [""]),
        ({"cron": None}, "SCHEDULE_INVALID", [""]),
        ({"timezone": "Mars/Olympus"}, "SCHEDULE_INVALID", ["/timezone"]),
        ({"cron": None, "everySeconds": 0}, "BODY_INVALID", ["/everySeconds"]),
        ({"cron": 5}, "BODY_INVALID", ["/cron"]),
        ({"catchUp": "some"}, "BODY_INVALID", ["/catchUp"]),
        ({"paused": "no"}, "BODY_INVALID", ["/paused"]),
        ({"start": "now"}, "BODY_INVALID", ["/start"]),
        ({"data": {"report": "x" * 21}}, "DATA_INVALID", ["/data/report"]),
    ],
)
def test_bad_input_is_a_problem_and_writes_nothing(
    api: Api, runtime_engine: Engine, change: dict, code: str, paths: list[str]
) -> None:
    body = {"flowId": publish(api), "cron": "0 4 * * *", **change}
    body = {name: value for name, value in body.items() if value is not None}
    answer = put(api, "s", body)

    assert answer.status_code == 422, answer.get_data(as_text=True)
    found = problem(answer)
    assert found["code"] == code
    assert [p["path"] for p in found["problems"]] == paths
    assert count(runtime_engine, "schedule") == 0


def test_a_flow_of_any_trigger_needs_a_transition_from_its_initial_state(
    api: Api, runtime_engine: Engine
) -> None:
    manual = api.publish(schedule_flow(trigger="manual", start=None, dataSchema=None), **who())[
        "id"
    ]

    without = put(api, "s", {"flow": manual, "everySeconds": 60})
    wrong = put(api, "s", {"flow": manual, "transition": "nope", "everySeconds": 60})

    for answer, message in (
        (without, "the flow has no `start`: name the transition each fire starts"),
        (wrong, "the flow has no transition 'nope' from 'new'"),
    ):
        assert answer.status_code == 422
        body = problem(answer)
        assert body["code"] == "SCHEDULE_TRANSITION_INVALID"
        assert body["problems"] == [{"path": "/transition", "message": message}]
    assert count(runtime_engine, "schedule") == 0
    named = put(api, "s", {"flow": manual, "transition": "run", "everySeconds": 60})
    assert named.status_code == 201, named.get_data(as_text=True)
    assert (named.get_json()["transition"], named.get_json()["flowKey"]) == ("run", None)


def test_neither_or_both_of_flow_and_flow_id_is_refused(api: Api, runtime_engine: Engine) -> None:
    flow_id = publish(api)

    for body in ({"everySeconds": 60}, {"flow": "tick", "flowId": flow_id, "everySeconds": 60}):
        answer = put(api, "s", body)
        assert answer.status_code == 422
        assert problem(answer)["code"] == "BODY_INVALID"
        assert [p["path"] for p in problem(answer)["problems"]] == ["/flow"]
    assert count(runtime_engine, "schedule") == 0


@pytest.mark.parametrize("flow_id", ["foreign", "missing", "not-a-uuid"])
def test_a_foreign_missing_or_malformed_flow_is_404(
    api: Api, runtime_engine: Engine, flow_id: str
) -> None:
    if flow_id == "foreign":
        flow_id = publish(api, org=OTHER_ORG)
    elif flow_id == "missing":
        flow_id = str(uuid.uuid4())
    answer = put(api, "s", {"flowId": flow_id, "everySeconds": 60})

    assert answer.status_code == 404
    assert problem(answer)["code"] == "NOT_FOUND"
    assert count(runtime_engine, "schedule") == 0


def test_another_organizations_schedule_is_404_and_not_listed(api: Api) -> None:
    put(api, "mine", {"flowId": publish(api), "everySeconds": 60})
    put(api, "theirs", {"flowId": publish(api, org=OTHER_ORG), "everySeconds": 60}, org=OTHER_ORG)

    assert get(api, "/schedules/theirs").status_code == 404
    assert get(api, "/schedules/nobody").status_code == 404
    deleted = api.client().delete("/api/v1/schedules/theirs", headers=api.headers(**who()))
    assert deleted.status_code == 404
    assert [s["id"] for s in get(api, "/schedules").get_json()["items"]] == ["mine"]
    assert get(api, "/schedules/theirs", org=OTHER_ORG).status_code == 200


def test_the_same_id_in_two_organizations_is_two_schedules(api: Api) -> None:
    put(api, "s", {"flowId": publish(api), "everySeconds": 60})
    put(api, "s", {"flowId": publish(api, org=OTHER_ORG), "everySeconds": 120}, org=OTHER_ORG)

    assert get(api, "/schedules/s").get_json()["everySeconds"] == 60
    assert get(api, "/schedules/s", org=OTHER_ORG).get_json()["everySeconds"] == 120


def test_schedules_need_the_plans_admin_scope(api: Api) -> None:
    flow_id = publish(api)
    headers = api.headers(scopes=["flows:admin", "requests:read"])
    answer = api.client().put(
        "/api/v1/schedules/s", json={"flowId": flow_id, "everySeconds": 60}, headers=headers
    )
    assert answer.status_code == 403
    assert api.client().get("/api/v1/schedules", headers=headers).status_code == 403


def test_a_schedule_id_too_long_is_refused(api: Api) -> None:
    answer = put(api, "x" * 201, {"flowId": publish(api), "everySeconds": 60})
    assert answer.status_code == 422
    assert problem(answer)["code"] == "SCHEDULE_ID_INVALID"
    assert get(api, "/schedules/" + "x" * 201).status_code == 404


def test_deleting_a_schedule(api: Api) -> None:
    put(api, "s", {"flowId": publish(api), "everySeconds": 60})
    headers = api.headers(**who())

    assert api.client().delete("/api/v1/schedules/s", headers=headers).status_code == 204
    assert get(api, "/schedules/s").status_code == 404
    assert api.client().delete("/api/v1/schedules/s", headers=headers).status_code == 404
