"""Bulk actions by query over HTTP: preview, acceptance, the worker's chunks, progress, refusals."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.queue.bulk import BulkWalk, act_on_chunk
from tests.integration.api_support import Api, problem, running_api
from tests.integration.bulk_support import (
    ON_ERROR,
    STEP,
    arrange,
    audits,
    items,
    parked,
    publish,
    statuses,
    table_counts,
)
from tests.integration.worker_support import ORG

OTHER_ORG = "org-elsewhere"
REASON = "the provider's maintenance window: nothing may run tonight"


def operator(org: str = ORG, *scopes: str) -> dict[str, Any]:
    return {
        "org": org,
        "sub": "carol",
        "scopes": list(scopes or ("executions:cancel", "executions:reconcile")),
    }


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def run_to_end(engine: Engine, chunk_items: int = 3) -> int:
    """What the worker's loop does, round after round, until a round finds nothing."""
    walk, acted, rounds = BulkWalk(), 0, 0
    while True:
        done = act_on_chunk(engine, walk, claims_budget=10, chunk_items=chunk_items)
        acted += done
        rounds += 1
        if done == 0:
            return acted
        assert rounds < 1000


def start(api: Api, body: dict[str, Any], **who: Any) -> dict[str, Any]:
    response = api.post("/executions/bulk", body, **(who or operator()))
    assert response.status_code == 202, response.get_data(as_text=True)
    accepted = response.get_json()
    assert response.headers["Location"] == f"/api/v1/bulk/{accepted['bulkId']}"
    return accepted


def progress(api: Api, bulk_id: str, **who: Any) -> dict[str, Any]:
    response = api.get(f"/bulk/{bulk_id}", **(who or operator()))
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def test_a_preview_counts_and_samples_and_records_nothing(api: Api, owner_engine: Engine) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 12)
    arrange(owner_engine, flow, 2, status="RUNNING")
    arrange(owner_engine, publish(owner_engine, OTHER_ORG), 3, org=OTHER_ORG)
    # Dry runs are never what an operator means: a bulk action never takes one.
    arrange(owner_engine, flow, 4, simulation=True)

    response = api.post(
        "/executions/bulk",
        {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON, "preview": True},
        **operator(),
    )

    assert response.status_code == 200, response.get_data(as_text=True)
    preview = response.get_json()
    assert preview["action"] == "cancel" and preview["count"] == 12
    assert len(preview["sample"]) == 10
    assert {item["id"] for item in preview["sample"]} <= {str(i) for i in pending}
    first = preview["sample"][0]
    assert first["status"] == "PENDING" and first["flowVersion"] == 1
    assert table_counts(owner_engine) == (0, 0)
    assert set(statuses(owner_engine, pending).values()) == {"PENDING"}


def test_every_criterion_narrows_the_match(api: Api, owner_engine: Engine) -> None:
    flow, other_flow = publish(owner_engine), publish(owner_engine)
    arrange(owner_engine, flow, 2, machine_id="m-7")
    arrange(owner_engine, other_flow, 3)
    parked(owner_engine, flow, 4)
    with owner_engine.connect() as conn:
        now = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    later = arrange(owner_engine, other_flow, 1)

    def count(criteria: dict[str, Any]) -> int:
        body = {"filter": criteria, "action": "cancel", "reason": REASON, "preview": True}
        response = api.post("/executions/bulk", body, **operator())
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()["count"]

    assert count({"flowId": str(flow)}) == 6
    assert count({"flowId": str(flow), "status": "PENDING"}) == 2
    assert count({"machineId": "m-7"}) == 2
    assert count({"errorCode": "UNCERTAIN_OUTCOME"}) == 4
    assert count({"createdAfter": now.isoformat()}) == 1
    assert count({"createdBefore": now.isoformat(), "flowId": str(other_flow)}) == 3
    instant = (now + timedelta(days=1)).astimezone(UTC).isoformat().replace("+00:00", "Z")
    assert count({"createdBefore": instant}) == 10
    assert later


def test_a_bulk_cancel_runs_in_chunks_to_the_end_and_reports_what_it_did(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 7)
    waiting = arrange(owner_engine, flow, 1, status="RETRY_WAIT")
    running = arrange(owner_engine, flow, 2, status="RUNNING")
    written = arrange(owner_engine, flow, 1, status="RETRY_WAIT", checkpoint="SUCCEEDED")
    elsewhere = arrange(owner_engine, publish(owner_engine, OTHER_ORG), 2, org=OTHER_ORG)

    body = {"filter": {"flowId": str(flow)}, "action": "cancel", "reason": REASON}
    # The preview warns which one a cancel will park rather than end.
    preview = api.post("/executions/bulk", {**body, "preview": True}, **operator()).get_json()
    assert (preview["count"], preview["parks"]) == (11, 1)
    assert {item["id"] for item in preview["sample"] if item["parks"]} == {str(written[0])}
    accepted = start(api, body)
    assert accepted["status"] == "RUNNING" and accepted["total"] == 11
    before = progress(api, accepted["bulkId"])
    assert (before["status"], before["done"], before["succeeded"]) == ("RUNNING", 0, 0)

    # The worker's own role, three items a round: a chunk never needs more than DML.
    assert run_to_end(runtime_engine, chunk_items=3) == 11

    after = progress(api, accepted["bulkId"])
    assert after["status"] == "DONE" and after["finishedAt"] is not None
    assert (after["total"], after["done"], after["succeeded"]) == (11, 11, 10)
    assert after["refused"] == []
    # A RUNNING one is not cut mid-call: its cancel is requested, for its worker to apply.
    assert sorted(after["cancelRequested"]) == sorted(str(r) for r in running)
    # The park took effect: it is said as what was done, never as a refusal.
    (parked,) = after["parked"]
    assert (parked["executionId"], parked["code"]) == (str(written[0]), "CANCELLED_AFTER_WRITES")
    assert parked["detail"].startswith("parked for a decision")
    now = statuses(owner_engine, pending + waiting + running + written + elsewhere)
    assert {now[i] for i in pending + waiting} == {"CANCELLED"}
    assert {now[i] for i in running} == {"RUNNING"}
    with owner_engine.connect() as conn:
        requested = conn.execute(
            text(
                "SELECT count(*) FROM execution"
                " WHERE id = ANY(:ids) AND cancel_requested_by = 'carol'"
            ),
            {"ids": running},
        ).scalar()
    assert requested == 2
    # The write rule parks a cancel after a write for an operator; it never forces it.
    assert now[written[0]] == "RECONCILIATION_REQUIRED"
    assert {now[i] for i in elsewhere} == {"PENDING"}
    cancelled = audits(owner_engine, "EXECUTION_CANCELLED")
    assert set(cancelled) == set(pending + waiting)
    for rows in cancelled.values():
        (row,) = rows
        assert row.actor == "carol"
        assert row.detail["reason"] == REASON and row.detail["bulkId"] == accepted["bulkId"]
    (parked_row,) = audits(owner_engine, "RECONCILIATION_REQUIRED")[written[0]]
    assert parked_row.detail["cancelReason"] == REASON
    assert parked_row.detail["bulkId"] == accepted["bulkId"]


def test_retry_and_fail_decide_about_parked_executions_only(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    flow = publish(owner_engine)
    to_retry = parked(owner_engine, flow, 3, machine_id="m-retry")
    to_fail = parked(owner_engine, flow, 2, machine_id="m-fail")
    not_parked = arrange(owner_engine, flow, 1, machine_id="m-retry")

    retried = start(
        api, {"filter": {"machineId": "m-retry"}, "action": "retry", "reason": "no charge"}
    )
    failed = start(
        api, {"filter": {"machineId": "m-fail"}, "action": "fail", "reason": "refunded by hand"}
    )
    assert run_to_end(runtime_engine) == 6

    retry_progress = progress(api, retried["bulkId"])
    assert (retry_progress["done"], retry_progress["succeeded"]) == (4, 3)
    assert retry_progress["refused"] == [
        {
            "executionId": str(not_parked[0]),
            "code": "NOT_RECONCILABLE",
            "detail": "the execution is PENDING, not parked for a decision",
        }
    ]
    assert progress(api, failed["bulkId"])["succeeded"] == 2
    now = statuses(owner_engine, to_retry + to_fail)
    assert {now[i] for i in to_retry} == {"PENDING"}
    assert {now[i] for i in to_fail} == {"FAILED"}
    resolved = audits(owner_engine, "RECONCILIATION_RESOLVED")
    assert set(resolved) == set(to_retry + to_fail)
    for execution_id, (row,) in resolved.items():
        # The decision names the step that was in doubt, as a single decision must.
        assert row.detail["actionId"] == STEP
        bulk_id = retried["bulkId"] if execution_id in to_retry else failed["bulkId"]
        assert row.detail["bulkId"] == bulk_id
    with owner_engine.connect() as conn:
        states = conn.execute(
            text(
                "SELECT r.state, r.busy_execution_id FROM request r JOIN execution e"
                " ON e.request_id = r.id WHERE e.id = ANY(:ids)"
            ),
            {"ids": to_fail},
        ).all()
    assert set(states) == {(ON_ERROR, None)}


def test_a_bulk_that_matches_nothing_is_done_at_once(api: Api, owner_engine: Engine) -> None:
    accepted = start(
        api, {"filter": {"errorCode": "NOTHING_HAS_THIS"}, "action": "cancel", "reason": REASON}
    )
    assert (accepted["status"], accepted["total"]) == ("DONE", 0)
    assert progress(api, accepted["bulkId"])["status"] == "DONE"


def test_too_many_matches_are_refused_before_anything_is_written(
    database, owner_engine: Engine
) -> None:
    arrange(owner_engine, publish(owner_engine), 3)
    body = {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON}
    with running_api(database.runtime_dsn, quota_bulk_items=2) as api:
        response = api.post("/executions/bulk", body, **operator())
    assert response.status_code == 422
    assert problem(response)["code"] == "BULK_TOO_LARGE"
    assert "quota bulkItems" in problem(response)["detail"]
    assert table_counts(owner_engine) == (0, 0)
    # ORG_QUOTAS raises it for the organization: the same filter is taken.
    overrides = json.dumps({ORG: {"bulkItems": 3}})
    with running_api(database.runtime_dsn, quota_bulk_items=2, org_quotas=overrides) as api:
        assert api.post("/executions/bulk", body, **operator()).status_code == 202


@pytest.mark.parametrize(
    ("action", "scopes"),
    [
        ("cancel", ("executions:reconcile",)),
        ("retry", ("executions:cancel",)),
        ("fail", ("executions:cancel", "requests:read-all", "requests:write")),
        ("cancel", ("requests:read-all", "requests:write")),
    ],
)
def test_an_action_needs_its_own_scope(
    api: Api, owner_engine: Engine, action: str, scopes: tuple[str, ...]
) -> None:
    arrange(owner_engine, publish(owner_engine), 1)
    for preview in (True, False):
        response = api.post(
            "/executions/bulk",
            {
                "filter": {"status": "PENDING"},
                "action": action,
                "reason": REASON,
                "preview": preview,
            },
            **operator(ORG, *scopes),
        )
        assert response.status_code == 403, response.get_data(as_text=True)
        assert problem(response)["code"] == "INSUFFICIENT_SCOPE"
    assert table_counts(owner_engine) == (0, 0)


def test_a_bulk_is_read_only_within_its_organization(api: Api, owner_engine: Engine) -> None:
    arrange(owner_engine, publish(owner_engine), 2)
    accepted = start(api, {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON})
    foreign = api.get(f"/bulk/{accepted['bulkId']}", **operator(OTHER_ORG))
    missing = api.get(f"/bulk/{uuid.uuid4()}", **operator())
    assert foreign.status_code == missing.status_code == 404
    assert problem(foreign) == problem(missing)
    no_scope = api.get(f"/bulk/{accepted['bulkId']}", scopes=["requests:read-all"], org=ORG)
    assert no_scope.status_code == 403
    # Another organization's bulk on the same filter takes none of these executions.
    theirs = start(
        api,
        {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON},
        **operator(OTHER_ORG),
    )
    assert theirs["total"] == 0
    assert api.get("/bulk/not-an-id", **operator()).status_code == 404


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"filter": {}, "action": "cancel", "reason": REASON}, "/filter"),
        ({"filter": {"status": "LOST"}, "action": "cancel", "reason": REASON}, "/filter/status"),
        ({"filter": {"flowId": "flow-1"}, "action": "cancel", "reason": REASON}, "/filter/flowId"),
        ({"filter": {"owner": "bob"}, "action": "cancel", "reason": REASON}, "/filter"),
        # A misspelled criterion beside a good one: refused, never a preview of every flow.
        (
            {
                "filter": {"status": "WAITING", "flow": "decommission"},
                "action": "cancel",
                "reason": REASON,
                "preview": True,
            },
            "/filter",
        ),
        (
            {"filter": {"createdAfter": "yesterday"}, "action": "cancel", "reason": REASON},
            "/filter/createdAfter",
        ),
        (
            {
                "filter": {"createdBefore": "2030-01-01T00:00:00"},
                "action": "cancel",
                "reason": REASON,
            },
            "/filter/createdBefore",
        ),
        ({"filter": {"status": "PENDING"}, "action": "confirm", "reason": REASON}, "/action"),
        ({"filter": {"status": "PENDING"}, "action": "cancel", "reason": "  "}, "/reason"),
        ({"filter": {"status": "PENDING"}, "action": "cancel"}, ""),
        (
            {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON, "preview": 1},
            "/preview",
        ),
        ({"filter": "PENDING", "action": "cancel", "reason": REASON}, "/filter"),
        (
            {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON, "all": True},
            "/all",
        ),
    ],
)
def test_a_bad_body_is_a_problem_and_writes_nothing(
    api: Api, owner_engine: Engine, body: dict[str, Any], path: str
) -> None:
    arrange(owner_engine, publish(owner_engine), 1)
    response = api.post("/executions/bulk", body, **operator())
    assert response.status_code == 422, response.get_data(as_text=True)
    found = problem(response)
    assert found["code"] == "BODY_INVALID"
    assert path in [p["path"] for p in found["problems"]]
    assert table_counts(owner_engine) == (0, 0)


def test_a_body_that_is_no_json_is_a_problem(api: Api) -> None:
    headers = {**api.headers(**operator()), "Content-Type": "application/json"}
    response = api.client().post("/api/v1/executions/bulk", data="{", headers=headers)
    assert response.status_code == 400 and problem(response)["code"] == "MALFORMED_JSON"
    response = api.client().post(
        "/api/v1/executions/bulk", data="x", headers={**api.headers(**operator())}
    )
    assert response.status_code == 415


def test_the_filter_is_kept_as_sent(api: Api, owner_engine: Engine) -> None:
    created_before = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    criteria = {"status": "PENDING", "createdBefore": created_before}
    arrange(owner_engine, publish(owner_engine), 1)
    accepted = start(api, {"filter": criteria, "action": "cancel", "reason": REASON})
    shown = progress(api, accepted["bulkId"])
    assert shown["filter"] == criteria
    assert (shown["action"], shown["actor"], shown["reason"]) == ("cancel", "carol", REASON)
    assert len(items(owner_engine, accepted["bulkId"])) == 1


def test_without_a_token_both_routes_answer_401(api: Api) -> None:
    body = {"filter": {"status": "PENDING"}, "action": "cancel", "reason": REASON}
    started = api.client().post("/api/v1/executions/bulk", json=body)
    read = api.client().get(f"/api/v1/bulk/{uuid.uuid4()}")
    assert started.status_code == read.status_code == 401
    assert problem(started)["code"] == problem(read)["code"] == "UNAUTHENTICATED"
