"""One child per item after kill -9 of the rollout's worker between starting children."""

from __future__ import annotations

import signal
from collections import Counter

from sqlalchemy import text

from tests.acceptance.crash_support import read_ledger, spawn_worker
from tests.integration.rollout_support import children, start_rollout
from tests.integration.worker_support import execution, status_is, wait_until

MACHINES = [f"m-{n:02}" for n in range(12)]


def _expire_every_lease(engine) -> None:
    """What the passing of time does to a dead worker's leases."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE execution SET lease_expires_at = clock_timestamp() - interval '1 s'"
                " WHERE status = 'RUNNING'"
            )
        )


def test_sigkill_inside_a_child_s_start_leaves_one_child_per_item(
    database, runtime_engine, processes, tmp_path
):
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    parent = start_rollout(runtime_engine, MACHINES, batch=4, maxFailures=0)
    victim = spawn_worker(
        database,
        "tests.acceptance.rollout_adapters",
        ledger,
        "victim",
        lease_seconds=12,
        renew_seconds=3,
        concurrency=3,
    )
    processes.append(victim)
    wait_until(
        lambda: any(e["event"] == "blocking" for e in read_ledger(ledger)),
        timeout=60,
        what="the victim blocked inside the fourth child's start",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    # Three children committed; the fourth was written but never committed.
    assert [c.item_index for c in children(runtime_engine, parent)] == [0, 1, 2]
    _expire_every_lease(runtime_engine)

    survivor = spawn_worker(
        database, "tests.acceptance.rollout_adapters", ledger, "survivor", concurrency=4
    )
    processes.append(survivor)
    wait_until(status_is(runtime_engine, parent, "SUCCEEDED", "FAILED"), timeout=90)
    survivor.send_signal(signal.SIGTERM)
    survivor.wait(30)

    assert execution(runtime_engine, parent).status == "SUCCEEDED"
    started = children(runtime_engine, parent)
    assert [c.item_index for c in started] == list(range(len(MACHINES)))
    assert [c.machine_id for c in started] == MACHINES
    assert {c.execution_status for c in started} == {"SUCCEEDED"}
    with runtime_engine.connect() as conn:
        requests_per_item = (
            conn.execute(
                text(
                    "SELECT count(*) FROM audit_event WHERE kind = 'TRANSITION_ACCEPTED'"
                    " AND detail -> 'startedBy' ->> 'rollout' = :parent"
                    " GROUP BY detail -> 'startedBy' ->> 'item'"
                ),
                {"parent": str(parent)},
            )
            .scalars()
            .all()
        )
    assert sorted(requests_per_item) == [1] * len(MACHINES)
    # The provider's view: each machine patched by one child (one external key; a child's
    # idempotent retry under its own key would be the same write).
    keys: dict[str, set[str]] = {}
    for event in read_ledger(ledger):
        if event["event"] == "patched":
            keys.setdefault(event["machine"], set()).add(event["key"])
    assert sorted(keys) == MACHINES
    assert {len(k) for k in keys.values()} == {1}
    # The fourth item was written twice (the victim's rollback, the survivor's commit).
    written = Counter(e["item"] for e in read_ledger(ledger) if e["event"] == "child written")
    assert written[3] == 2
