"""The quota openExecutions: every way work enters is refused 429 once an organization has
as many executions not ended as it may, counted from a partial index."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import ORG, OTHER_ORG, Api, problem, running_api
from automation_support import AUTOMATION_SCOPES, moment_flow
from schedule_support import SCHEDULE_SCOPES, put, schedule_flow
from sqlalchemy import Engine, text

from orquestador.api import quota_checks
from orquestador.db.schema import OPEN_EXECUTION
from orquestador.domain.statuses import OPEN
from orquestador.queue.open_executions import FAR_BELOW, ROOM_SECONDS, RecentRoom, count_open

RUN = {"transition": "power-off", "data": {"machineId": "m-1"}}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, quota_open_executions=2) as api:
        yield api


def _run(api: Api, flow_id: str, **who: Any):
    return api.post("/runs", {"flow": flow_id, **RUN}, **who)


def _refused_by_the_quota(answer: Any, limit: int = 2) -> None:
    assert answer.status_code == 429, answer.get_data(as_text=True)
    body = problem(answer)
    assert body["code"] == "QUOTA_EXCEEDED" and "openExecutions" in body["detail"]
    assert body["problems"][0]["message"] == f"quota openExecutions: {limit} of {limit}"
    assert answer.headers["Retry-After"] == "30"


def _end(owner_engine: Engine, status: str) -> None:
    """End (or park) one of the organization's open executions, as a worker would."""
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE execution SET status = :status, finished_at = now() WHERE id ="
                " (SELECT id FROM execution WHERE org_id = :org AND status = 'PENDING' LIMIT 1)"
            ),
            {"status": status, "org": ORG},
        )


def test_runs_transitions_and_dry_runs_beyond_the_quota_are_429(
    api: Api, owner_engine: Engine
) -> None:
    flow_id = api.publish()["id"]
    waiting = api.create_request(flow_id)
    assert _run(api, flow_id).status_code == 202
    assert _run(api, flow_id).status_code == 202

    _refused_by_the_quota(_run(api, flow_id))
    _refused_by_the_quota(api.transition(waiting["id"], "power-off", waiting["revision"]))
    dry_run = {"transition": "power-off", "data": {"machineId": "m-1"}}
    _refused_by_the_quota(api.post(f"/flows/{flow_id}/dry-runs", dry_run))
    # Another organization counts its own.
    other_flow = api.publish(org=OTHER_ORG)["id"]
    assert _run(api, other_flow, org=OTHER_ORG).status_code == 202

    # A parked execution is still open: it waits for a person.
    _end(owner_engine, "RECONCILIATION_REQUIRED")
    _refused_by_the_quota(_run(api, flow_id))
    # One that ended makes room for one more.
    _end(owner_engine, "SUCCEEDED")
    assert api.transition(waiting["id"], "power-off", waiting["revision"]).status_code == 202
    _refused_by_the_quota(_run(api, flow_id))


def test_events_and_a_schedule_s_run_now_beyond_the_quota_are_429(database) -> None:
    with running_api(database.runtime_dsn, quota_open_executions=1) as api:
        scopes = {"scopes": AUTOMATION_SCOPES}
        api.client().put("/api/v1/plans/vps", json={"name": "vps"}, headers=api.headers(**scopes))
        flow_id = api.publish(moment_flow(), **scopes)["id"]
        bound = api.client().put(
            "/api/v1/plans/vps/bindings/provisioned",
            json={"flowId": flow_id},
            headers=api.headers(**scopes),
        )
        assert bound.status_code == 200, bound.get_data(as_text=True)
        event = {"moment": "provisioned", "planId": "vps", "machineId": "m-1", "data": {}}
        first = api.post("/events", {"id": "evt-1", **event}, **scopes)
        second = api.post("/events", {"id": "evt-2", **event}, **scopes)
        tick = api.publish(schedule_flow(), scopes=SCHEDULE_SCOPES)["id"]
        assert put(api, "tick", {"flowId": tick, "everySeconds": 600}).status_code == 201
        run_now = api.post("/schedules/tick/runs", {}, scopes=SCHEDULE_SCOPES)

    assert first.status_code == 202, first.get_data(as_text=True)
    _refused_by_the_quota(second, limit=1)
    _refused_by_the_quota(run_now, limit=1)


def test_org_quotas_overrides_it_and_get_quotas_shows_the_use(database) -> None:
    overrides = json.dumps({ORG: {"openExecutions": 3}})
    with running_api(database.runtime_dsn, quota_open_executions=1, org_quotas=overrides) as api:
        flow_id = api.publish()["id"]
        answers = [_run(api, flow_id).status_code for _ in range(4)]
        quotas = api.get(f"/orgs/{ORG}/quotas", scopes=["org:admin"]).get_json()["quotas"]
        others = api.get(f"/orgs/{OTHER_ORG}/quotas", scopes=["org:admin"], org=OTHER_ORG)

    assert answers == [202, 202, 202, 429]
    assert quotas["openExecutions"] == {"limit": 3, "used": 3}
    assert quotas["rolloutItems"] == {"limit": 10_000}
    assert others.get_json()["quotas"]["openExecutions"] == {"limit": 1, "used": 0}


def test_the_count_reads_the_partial_index_and_stops_at_the_limit(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = api.publish()["id"]
    assert _run(api, flow_id).status_code == 202
    assert _run(api, flow_id).status_code == 202
    assert {f"'{status}'" for status in OPEN} == set(
        OPEN_EXECUTION.split("(", 1)[1].rstrip(")").split(", ")
    )
    with runtime_engine.connect() as connection:
        assert count_open(connection, ORG, up_to=1) == 1
        assert count_open(connection, ORG, up_to=10) == 2
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        plan = connection.execute(
            text(
                "EXPLAIN SELECT count(*) FROM (SELECT 1 FROM execution"
                f" WHERE org_id = :org AND {OPEN_EXECUTION} LIMIT 5) AS o"
            ),
            {"org": ORG},
        ).scalars()
        assert "ix_execution_open" in "\n".join(plan)


def test_far_below_the_limit_a_count_is_kept_a_second_near_it_never(
    database, owner_engine: Engine
) -> None:
    now = [1000.0]
    limit = FAR_BELOW + 5
    with running_api(database.runtime_dsn, quota_open_executions=limit) as api:
        api.app.extensions[quota_checks.ROOM_KEY] = RecentRoom(clock=lambda: now[0])
        flow_id = api.publish()["id"]
        assert _run(api, flow_id).status_code == 202  # counted: 0, far below
        _fill(owner_engine, flow_id, limit)
        # Within the second the count is not taken again: accepted over the limit.
        assert _run(api, flow_id).status_code == 202
        now[0] += ROOM_SECONDS
        over = _run(api, flow_id)
        now[0] += ROOM_SECONDS
        # At the limit, every acceptance counts.
        again = _run(api, flow_id)

    assert over.status_code == 429 and again.status_code == 429


def _fill(owner_engine: Engine, flow_id: str, count: int) -> None:
    """`count` more PENDING executions of the organization, each on a request of its own."""
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "WITH r AS (INSERT INTO request (org_id, owner_id, flow_id, state, revision,"
                " data, created_by) SELECT :org, 'alice', :flow, 'new', 2,"
                " '{\"machineId\": \"m\"}'::jsonb, 'alice' FROM generate_series(1, :n)"
                " RETURNING id)"
                " INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot, status, next_attempt_at)"
                " SELECT id, :org, :flow, 'power-off', 2, 'new', '{\"sub\": \"alice\"}',"
                " 'PENDING', now() + interval '1 day' FROM r"
            ),
            {"org": ORG, "flow": flow_id, "n": count},
        )
