"""Concurrency keys, priorities and fair claims on a real PostgreSQL (SPEC 19).

Executions are accepted through the API (its acceptance reads the key), claimed with the
worker's claim, and ended by the worker's executor.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.db.schema import KEY_LOCK_CLASS
from orquestador.queue import require_reconciliation
from orquestador.queue.claims import ClaimRound, claim_round
from orquestador.queue.reconciliation import Resolution, cancel, resolve
from orquestador.worker.executor import Executor
from tests.integration.api_support import ORG, OTHER_ORG, Api, problem, running_api
from tests.integration.execution_page_support import signed_in, text_of
from tests.integration.worker_support import expire_lease, registry_of, settings

MACHINE_SCHEMA = {
    "type": "object",
    "properties": {"machineId": {"type": "string"}, "n": {"type": "integer"}},
    "additionalProperties": False,
}


def keyed_flow(limit: int = 1, **extra: Any) -> dict[str, Any]:
    """A flow whose one transition holds the machine's key and runs nothing."""
    return {
        "key": f"reboot-{uuid.uuid4().hex[:6]}",
        "trigger": "manual",
        "dataSchema": MACHINE_SCHEMA,
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "actions": [],
                "to": "done",
                "concurrency": {"key": "/data/machineId", "limit": limit},
            }
        ],
        **extra,
    }


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def start(api: Api, flow_id: str, machine: str = "m-1", org: str = ORG, **body: Any) -> str:
    """Accept the flow's transition on a new request; the execution's id."""
    request = api.create_request(flow_id, {"machineId": machine}, org=org)
    response = api.post(
        f"/requests/{request['id']}/transitions",
        {"transition": "go", "expectedRevision": request["revision"], **body},
        org=org,
    )
    assert response.status_code == 202, response.get_data(as_text=True)
    return response.get_json()["executionId"]


def claim(engine: Engine, limit: int, owner: str = "w1", **weights: float) -> ClaimRound:
    with engine.connect() as conn:
        return claim_round(conn, owner, limit=limit, lease_seconds=30, org_weights=weights)


def ids(round_: ClaimRound) -> set[str]:
    return {str(c.execution_id) for c in round_.claims}


def finish(engine: Engine, round_: ClaimRound) -> None:
    """Run each claimed execution to its end (the flows run no action)."""
    executor = Executor(registry_of(), settings())
    for claimed in round_.claims:
        with engine.connect() as conn:
            assert executor.run(conn, claimed) == "SUCCEEDED"


def claim_after_release(engine: Engine, limit: int = 10) -> ClaimRound:
    """What the worker does after a holder ended: a claim takes the release up and lets
    the blocked execution back, and the claim it makes at once takes it."""
    woke = claim(engine, limit)
    assert woke.released >= 1, woke
    return woke if woke.claims else claim(engine, limit)


def rows(engine: Engine, *execution_ids: str) -> dict[str, Any]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT id, status, key_blocked, priority, concurrency_key, concurrency_limit"
                " FROM execution WHERE id = ANY(:ids)"
            ),
            {"ids": [uuid.UUID(i) for i in execution_ids]},
        ).all()
    return {str(row.id): row for row in found}


def holders(engine: Engine, key: str = "m-1") -> int:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM execution WHERE concurrency_key = :key"
                " AND started_at IS NOT NULL"
                " AND status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
            ),
            {"key": key},
        ).scalar_one()


# --- one holder, whatever the interleaving --------------------------------------------


def test_claims_racing_for_the_one_place_under_a_key_leave_one_holder(api, runtime_engine):
    """Every claimer has read and locked its candidate before the first one commits: the
    key's lock, and the count it makes afresh, are all that stand between them."""
    flow = api.publish(keyed_flow())
    started = {start(api, flow["id"]) for _ in range(4)}
    claimers = len(started)
    barrier = threading.Barrier(claimers + 1)
    results: list[ClaimRound] = []
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait()
            results.append(claim(runtime_engine, 1, owner=f"w{index}"))
        except BaseException as exc:
            errors.append(exc)

    with runtime_engine.connect() as gate:
        # Hold the key's lock, so that every claim stops at it with its candidate locked.
        lock = {"class": KEY_LOCK_CLASS, "org": ORG}
        gate.execute(text("SELECT pg_advisory_lock(:class, hashtext(:org || '/m-1'))"), lock)
        threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
        for thread in threads:
            thread.start()
        barrier.wait()
        deadline = time.monotonic() + 20
        while _waiting_on_advisory_locks(gate) < claimers:
            assert time.monotonic() < deadline, "the claims never reached the key's lock"
            time.sleep(0.02)
        gate.execute(text("SELECT pg_advisory_unlock(:class, hashtext(:org || '/m-1'))"), lock)
        gate.commit()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert sorted(len(r.claims) for r in results) == [0, 0, 0, 1]
    assert sum(r.blocked for r in results) == 3
    assert holders(runtime_engine) == 1
    states = rows(runtime_engine, *started)
    assert sorted(r.status for r in states.values()) == ["PENDING"] * 3 + ["RUNNING"]
    assert all(r.key_blocked for r in states.values() if r.status == "PENDING")


def _waiting_on_advisory_locks(connection: Any) -> int:
    return connection.execute(
        text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    ).scalar_one()


def test_a_limit_of_two_lets_two_hold_and_keys_of_other_machines_run_beside(api, runtime_engine):
    flow = api.publish(keyed_flow(limit=2))
    first, second, third = (start(api, flow["id"]) for _ in range(3))
    other = start(api, flow["id"], machine="m-2")
    round_ = claim(runtime_engine, 10)
    assert ids(round_) == {first, second, other} and round_.blocked == 1
    assert rows(runtime_engine, third)[third].key_blocked


# --- a key is held from the first claim until the end, and handed on ----------------


def test_a_holder_that_ends_hands_the_key_to_the_oldest_blocked(api, runtime_engine):
    flow = api.publish(keyed_flow())
    first, second, third = (start(api, flow["id"]) for _ in range(3))
    round_ = claim(runtime_engine, 10)
    assert ids(round_) == {first} and round_.blocked == 2
    assert claim(runtime_engine, 10).claims == []  # blocked ones are out of the claim's way

    finish(runtime_engine, round_)
    # The end left a release; the next claim takes it up and lets the oldest back.
    woke = claim(runtime_engine, 10)
    assert woke.released == 1 and woke.claims == []
    after = rows(runtime_engine, second, third)
    assert not after[second].key_blocked and after[third].key_blocked
    nxt = claim(runtime_engine, 10)
    assert ids(nxt) == {second}
    finish(runtime_engine, nxt)
    assert ids(claim_after_release(runtime_engine)) == {third}


def test_a_retry_wait_keeps_the_key_and_a_cancel_releases_it_in_its_transaction(
    api, runtime_engine
):
    flow = api.publish(keyed_flow())
    holder, waiting = start(api, flow["id"]), start(api, flow["id"])
    first = claim(runtime_engine, 10)
    assert ids(first) == {holder} and first.blocked == 1
    with runtime_engine.begin() as conn:
        # What a transient failure leaves: the execution waits for its next attempt.
        conn.execute(
            text(
                "UPDATE execution SET status = 'RETRY_WAIT', lease_owner = NULL,"
                " lease_expires_at = NULL, next_attempt_at = now() + interval '1 hour'"
                " WHERE id = :id"
            ),
            {"id": holder},
        )
    assert claim(runtime_engine, 10).claims == []
    assert holders(runtime_engine) == 1 and rows(runtime_engine, waiting)[waiting].key_blocked

    with runtime_engine.connect() as conn:
        cancelled = cancel(
            conn, uuid.UUID(holder), org_id=ORG, actor="carol", reason="machine retired"
        )
    assert cancelled.status == "CANCELLED"
    assert holders(runtime_engine) == 0
    # The cancel's own transaction left the release the next claim takes up.
    assert ids(claim_after_release(runtime_engine)) == {waiting}


def test_a_parked_execution_keeps_the_key_and_a_reconciliation_releases_it(api, runtime_engine):
    """RECONCILIATION_REQUIRED holds the key: the machine may be mid-change. The
    operator's decision ends it and hands the key on in the decision's transaction."""
    flow = api.publish(keyed_flow())
    holder, waiting = start(api, flow["id"]), start(api, flow["id"])
    first = claim(runtime_engine, 10)
    assert ids(first) == {holder} and first.blocked == 1
    with runtime_engine.connect() as conn:
        require_reconciliation(conn, first.claims[0], "UNCERTAIN_OUTCOME")
    assert rows(runtime_engine, holder)[holder].status == "RECONCILIATION_REQUIRED"
    assert claim(runtime_engine, 10).claims == []
    assert holders(runtime_engine) == 1 and rows(runtime_engine, waiting)[waiting].key_blocked

    # The decision a bulk fail by query makes: it names no step (this flow has none).
    decision = Resolution(uuid.UUID(holder), ORG, "operator-1", "fail", "rebuilt by hand")
    with runtime_engine.connect() as conn:
        assert resolve(conn, decision, output_problems=lambda *_: [], claims_budget=3) == "FAILED"
    assert rows(runtime_engine, holder)[holder].status == "FAILED"
    with runtime_engine.connect() as conn:
        request = conn.execute(
            text(
                "SELECT r.state, r.busy_execution_id, r.data FROM request r"
                " JOIN execution e ON e.request_id = r.id WHERE e.id = :id"
            ),
            {"id": holder},
        ).one()
    # Released where it was, with its data: the decision named no state to go to.
    assert (request.state, request.busy_execution_id, request.data) == (
        "new",
        None,
        {"machineId": "m-1"},
    )
    assert holders(runtime_engine) == 0
    assert ids(claim_after_release(runtime_engine)) == {waiting}


def test_a_lapsed_lease_keeps_the_key_until_the_recovery_ends_the_execution(api, runtime_engine):
    flow = api.publish(keyed_flow())
    holder = start(api, flow["id"])
    assert ids(claim(runtime_engine, 10, owner="dead")) == {holder}
    expire_lease(runtime_engine, uuid.UUID(holder))
    waiting = start(api, flow["id"])
    recovery = claim(runtime_engine, 10, owner="w2")
    # The abandoned holder is taken back; the newcomer still finds the key held.
    assert ids(recovery) == {holder} and recovery.blocked == 1
    finish(runtime_engine, recovery)
    assert ids(claim_after_release(runtime_engine)) == {waiting}


def test_an_ended_execution_never_holds_its_key(api, runtime_engine):
    flow = api.publish(keyed_flow())
    executions = [start(api, flow["id"]) for _ in range(3)]
    for n, _ in enumerate(executions):
        round_ = claim(runtime_engine, 10) if n == 0 else claim_after_release(runtime_engine)
        assert len(round_.claims) == 1
        finish(runtime_engine, round_)
        assert holders(runtime_engine) == 0
    assert {r.status for r in rows(runtime_engine, *executions).values()} == {"SUCCEEDED"}


def test_a_holder_ending_while_a_claim_blocks_on_its_key_still_hands_the_key_on(
    api, runtime_engine, owner_engine
):
    """The claim counts the holder that is ending (its transaction is still open) and
    blocks the newcomer; the end commits after. The key is handed on all the same: the
    end left a release that the next claim takes up under the key's lock."""
    flow = api.publish(keyed_flow())
    holder = start(api, flow["id"])
    assert ids(claim(runtime_engine, 10)) == {holder}
    waiting = start(api, flow["id"])
    with owner_engine.connect() as ending:
        ending.execute(
            text(
                "UPDATE execution SET status = 'SUCCEEDED', lease_owner = NULL,"
                " lease_expires_at = NULL, finished_at = now() WHERE id = :id"
            ),
            {"id": holder},
        )
        # Open, not committed: the claim still counts the holder.
        assert claim(runtime_engine, 10).blocked == 1
        ending.commit()
    assert rows(runtime_engine, waiting)[waiting].key_blocked
    woke = claim(runtime_engine, 10)
    assert woke.released == 1 and woke.claims == []
    assert ids(claim(runtime_engine, 10)) == {waiting}


# --- priorities and fairness ------------------------------------------------------------


def test_higher_priority_first_and_oldest_first_within_a_priority(api, runtime_engine):
    flow = api.publish({**keyed_flow(), "priority": 3})
    low = start(api, flow["id"], machine="a", priority=1)
    high = start(api, flow["id"], machine="b", priority=9)
    default = start(api, flow["id"], machine="c")
    high_later = start(api, flow["id"], machine="d", priority=9)
    order = [next(iter(ids(claim(runtime_engine, 1)))) for _ in range(4)]
    assert order == [high, high_later, default, low]
    assert rows(runtime_engine, default)[default].priority == 3  # the flow's default


def test_a_backlog_of_one_organization_never_queues_another_behind_it(api, runtime_engine):
    bulk = api.publish(keyed_flow(), org=ORG)
    trickle = api.publish(keyed_flow(), org=OTHER_ORG)
    for n in range(30):
        start(api, bulk["id"], machine=f"b{n}")
    assert len(claim(runtime_engine, 3).claims) == 3  # the backlog's first three run
    late = start(api, trickle["id"], machine="t", org=OTHER_ORG)
    # One free slot: it goes to the organization that runs nothing, though the backlog's
    # next execution is older.
    assert ids(claim(runtime_engine, 1)) == {late}


def test_weights_share_the_slots_unevenly(api, runtime_engine):
    heavy = api.publish(keyed_flow(), org=ORG)
    light = api.publish(keyed_flow(), org=OTHER_ORG)
    for n in range(10):
        start(api, heavy["id"], machine=f"h{n}")
        start(api, light["id"], machine=f"l{n}", org=OTHER_ORG)
    round_ = claim(runtime_engine, 8, **{ORG: 3.0})
    by_org = rows(runtime_engine, *ids(round_))
    with runtime_engine.connect() as conn:
        orgs = conn.execute(
            text("SELECT org_id, count(*) FROM execution WHERE id = ANY(:ids) GROUP BY org_id"),
            {"ids": [uuid.UUID(i) for i in by_org]},
        ).all()
    assert dict(orgs) == {ORG: 6, OTHER_ORG: 2}


# --- what people see, and what is refused --------------------------------------------------


def test_the_view_says_what_a_pending_execution_waits_for(api, runtime_engine):
    flow = api.publish(keyed_flow())
    holder, waiting = start(api, flow["id"]), start(api, flow["id"])
    claim(runtime_engine, 10)
    view = api.get(f"/executions/{waiting}").get_json()
    assert view["status"] == "PENDING" and view["priority"] == 5
    assert view["blockedBy"] == {"key": "m-1", "limit": 1, "holders": 1, "heldBy": [holder]}
    assert "blockedBy" not in api.get(f"/executions/{holder}").get_json()
    # Another person of the organization sees that the key is held, not by what.
    other = api.get(f"/executions/{waiting}", sub="bob", scopes=["requests:read-all"]).get_json()
    assert other["blockedBy"]["heldBy"] == [holder]


def test_the_page_says_whose_turn_it_is_and_links_the_holder(api, runtime_engine):
    flow = api.publish(keyed_flow())
    holder, waiting = start(api, flow["id"]), start(api, flow["id"], priority=3)
    claim(runtime_engine, 10)
    page = signed_in(api).get(f"/ui/executions/{waiting}").get_data(as_text=True)
    words = text_of(page)
    assert "Waiting for its turn" in words and "Priority 3" in words
    assert "At most 1 execution of the organization may hold m-1 at a time, and 1 holds" in words
    assert f'href="/ui/executions/{holder}"' in page
    holder_page = signed_in(api).get(f"/ui/executions/{holder}").get_data(as_text=True)
    assert "Waiting for its turn" not in text_of(holder_page)


def test_publish_checks_the_key_pointer_against_the_data_schema(api):
    outside = keyed_flow()
    outside["transitions"][0]["concurrency"]["key"] = "/request/id"
    response = api.post("/flows", outside)
    assert response.status_code == 422
    assert problem(response)["problems"][0]["path"] == "/transitions/0/concurrency/key"

    ruled_out = keyed_flow()
    ruled_out["transitions"][0]["concurrency"]["key"] = "/data/hostname"
    body = problem(api.post("/flows", ruled_out))
    assert body["problems"] == [
        {
            "path": "/transitions/0/concurrency/key",
            "message": "/data/hostname reads a field the flow's dataSchema rules out",
        }
    ]


def test_a_request_without_the_key_is_refused_and_nothing_is_queued(api, runtime_engine):
    flow = api.publish(keyed_flow())
    request = api.create_request(flow["id"], {"n": 1})
    response = api.transition(request["id"], "go", request["revision"])
    assert response.status_code == 422
    body = problem(response)
    assert body["code"] == "CONCURRENCY_KEY_MISSING"
    assert body["problems"][0]["path"] == "/data/machineId"
    assert api.get(f"/requests/{request['id']}").get_json()["revision"] == request["revision"]


def test_priority_outside_zero_to_nine_is_refused(api):
    flow = api.publish(keyed_flow())
    request = api.create_request(flow["id"], {"machineId": "m-1"})
    body = {"transition": "go", "expectedRevision": request["revision"], "priority": 10}
    response = api.post(f"/requests/{request['id']}/transitions", body)
    assert response.status_code == 422
    assert problem(response)["code"] == "BODY_INVALID"
    assert problem(response)["problems"][0]["path"] == "/priority"


def test_a_dry_run_holds_no_key(api, runtime_engine):
    flow = api.publish(keyed_flow())
    real = start(api, flow["id"])
    response = api.post(
        f"/flows/{flow['id']}/dry-runs", {"transition": "go", "data": {"machineId": "m-1"}}
    )
    assert response.status_code == 202, response.get_data(as_text=True)
    rehearsal = response.get_json()["executionId"]
    assert ids(claim(runtime_engine, 10)) == {real, rehearsal}
    assert rows(runtime_engine, rehearsal)[rehearsal].concurrency_key is None


def test_a_correction_cannot_move_an_execution_to_a_machine_another_holds(api, runtime_engine):
    """E1 parked on m-1 is retried with its machine corrected to m-2, which E2 holds: the
    retry would reboot m-2 while E2 does. The correction is refused, naming the key, and
    nothing is written; a correction that keeps the key is taken."""
    flow = api.publish(keyed_flow())
    first, second = start(api, flow["id"], "m-1"), start(api, flow["id"], "m-2")
    both = claim(runtime_engine, 10)
    assert ids(both) == {first, second}
    parked = next(c for c in both.claims if str(c.execution_id) == first)
    with runtime_engine.connect() as conn:
        require_reconciliation(conn, parked, "UNCERTAIN_OUTCOME")
    before = rows(runtime_engine, first)[first]

    moved = api.post(
        f"/executions/{first}/reconciliation",
        {
            "decision": "retry",
            "reason": "it was the other machine",
            "actionId": None,
            "correction": [{"path": "/n", "value": 2}, {"path": "/machineId", "value": "m-2"}],
        },
        scopes=["executions:reconcile", "requests:read-all"],
    )

    assert moved.status_code == 422, moved.get_data(as_text=True)
    refused = problem(moved)
    assert refused["code"] == "CORRECTION_INVALID"
    assert "/data/machineId" in refused["detail"]
    assert [p["path"] for p in refused["problems"]] == ["/correction/1/path"]
    assert tuple(rows(runtime_engine, first)[first]) == tuple(before)
    assert holders(runtime_engine, "m-2") == 1

    kept = api.post(
        f"/executions/{first}/reconciliation",
        {
            "decision": "retry",
            "reason": "the count was wrong",
            "actionId": None,
            "correction": [{"path": "/n", "value": 3}, {"path": "/machineId", "value": "m-1"}],
        },
        scopes=["executions:reconcile", "requests:read-all"],
    )
    assert kept.status_code == 200, kept.get_data(as_text=True)
    assert rows(runtime_engine, first)[first].concurrency_key == "m-1"


def test_a_new_execution_never_takes_a_freed_place_ahead_of_an_older_blocked_one(
    api, runtime_engine
):
    """The holder ends; before any claim takes its release up, a new execution of the key
    arrives, still in the claim's index while the older one is blocked out of it. The
    place goes to the older one: oldest first under a key."""
    flow = api.publish(keyed_flow())
    holder, older = start(api, flow["id"]), start(api, flow["id"])
    round_ = claim(runtime_engine, 10)
    assert ids(round_) == {holder} and round_.blocked == 1
    finish(runtime_engine, round_)
    newer = start(api, flow["id"])

    first = claim(runtime_engine, 10)
    assert ids(first) == set(), "the newer execution took the place of the older one"
    assert rows(runtime_engine, newer)[newer].key_blocked
    nxt = claim(runtime_engine, 10)
    assert ids(nxt) == {older}
    finish(runtime_engine, nxt)
    assert ids(claim_after_release(runtime_engine)) == {newer}


def test_a_holder_due_again_runs_without_asking_the_full_key_for_room(api, runtime_engine):
    """A holder back from a transient failure holds the key's only place: it runs again,
    and is not blocked behind itself."""
    flow = api.publish(keyed_flow())
    holder = start(api, flow["id"])
    assert ids(claim(runtime_engine, 10)) == {holder}
    with runtime_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE execution SET status = 'RETRY_WAIT', lease_owner = NULL,"
                " lease_expires_at = NULL, next_attempt_at = now() WHERE id = :id"
            ),
            {"id": holder},
        )
    assert ids(claim(runtime_engine, 10)) == {holder}
    assert not rows(runtime_engine, holder)[holder].key_blocked


def test_a_parked_holder_keeps_a_newcomer_of_its_key_out(api, runtime_engine):
    """Parked for a person, the holder still holds the machine: a new execution of the key
    is blocked, not run beside it."""
    flow = api.publish(keyed_flow())
    holder = start(api, flow["id"])
    first = claim(runtime_engine, 10)
    assert ids(first) == {holder}
    with runtime_engine.connect() as conn:
        require_reconciliation(conn, first.claims[0], "UNCERTAIN_OUTCOME")
    newcomer = start(api, flow["id"])
    round_ = claim(runtime_engine, 10)
    assert ids(round_) == set() and round_.blocked == 1
    assert rows(runtime_engine, newcomer)[newcomer].key_blocked
