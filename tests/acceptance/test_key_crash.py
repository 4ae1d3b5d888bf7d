"""A worker killed while its executions hold their machines' keys: no two calls on one machine
ever overlap, before the kill or after the recovery, and every key is let go of at the end."""

from __future__ import annotations

import itertools
import signal
import uuid

from sqlalchemy import text

from tests.acceptance.crash_support import read_ledger, spawn_worker
from tests.integration.worker_support import (
    accept_transition,
    create_request,
    expire_lease,
    publish_flow,
    wait_until,
)

ADAPTERS = "tests.acceptance.key_adapters"


def _keyed_flow() -> dict:
    return {
        "key": f"hold-{uuid.uuid4().hex[:6]}",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "concurrency": {"key": "/data/machineId", "limit": 1},
                "actions": [
                    {
                        "id": "hold",
                        "capability": "crash.hold",
                        "version": 1,
                        "input": {"machineId": {"from": "/data/machineId"}},
                    }
                ],
                "to": "done",
            }
        ],
    }


def _accept_keyed(engine, flow_id, machine: str) -> uuid.UUID:
    """The API's acceptance, key included (the helper writes the row as the API does)."""
    execution_id = accept_transition(
        engine, create_request(engine, flow_id, {"machineId": machine})
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE execution SET concurrency_key = :machine, concurrency_limit = 1"
                " WHERE id = :id"
            ),
            {"machine": machine, "id": execution_id},
        )
    return execution_id


def test_sigkill_of_a_key_holder_never_lets_two_calls_on_one_machine_overlap(
    database, runtime_engine, owner_engine, processes, tmp_path
):
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    flow_id = publish_flow(owner_engine, _keyed_flow())
    machines = ["m-1"] * 5 + ["m-2"] * 3
    executions = [_accept_keyed(owner_engine, flow_id, machine) for machine in machines]

    victim = spawn_worker(database, ADAPTERS, ledger, "victim")
    processes.append(victim)
    wait_until(
        lambda: (
            {e["machine"] for e in read_ledger(ledger) if e["event"] == "blocking"}
            == {"m-1", "m-2"}
        ),
        timeout=60,
        what="the victim holding both machines' keys, blocked in their calls",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = max(e["at"] for e in read_ledger(ledger))
    with runtime_engine.connect() as conn:
        running = (
            conn.execute(text("SELECT id FROM execution WHERE status = 'RUNNING'")).scalars().all()
        )
    assert len(running) == 2  # one per machine: the others waited for the keys
    for execution_id in running:
        expire_lease(runtime_engine, execution_id)  # what time does to a dead holder's lease

    for n in range(2):
        survivor = spawn_worker(database, ADAPTERS, ledger, f"survivor-{n}")
        processes.append(survivor)

    def all_ended() -> bool:
        with runtime_engine.connect() as conn:
            return conn.execute(
                text("SELECT bool_and(status = 'SUCCEEDED') FROM execution WHERE id = ANY(:ids)"),
                {"ids": executions},
            ).scalar_one()

    wait_until(all_ended, timeout=90, what="every execution to end")

    # No two calls on one machine overlapped: each survivor call started after the one
    # before it ended, and after the victim was gone.
    calls: dict[str, list[tuple[float, float]]] = {}
    started: dict[str, float] = {}
    for event in read_ledger(ledger):
        if event["role"] == "victim":
            continue
        if event["event"] == "start":
            started[event["key"]] = event["at"]
        elif event["event"] == "end":
            calls.setdefault(event["machine"], []).append((started.pop(event["key"]), event["at"]))
    assert sorted(len(v) for v in calls.values()) == [3, 5]
    for machine, spans in calls.items():
        spans.sort()
        assert spans[0][0] >= killed_at, f"{machine}: a call started before the victim died"
        for (_, ended), (began, _) in itertools.pairwise(spans):
            assert began >= ended, f"{machine}: two calls overlapped: {spans}"
    with runtime_engine.connect() as conn:
        held = conn.execute(
            text(
                "SELECT count(*) FROM execution WHERE concurrency_key IS NOT NULL"
                " AND started_at IS NOT NULL"
                " AND status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
            )
        ).scalar_one()
    assert held == 0
    # Each request went through its transition once, and none is left busy.
    with runtime_engine.connect() as conn:
        requests = conn.execute(
            text(
                "SELECT r.state, r.revision, r.busy_execution_id, r.data ->> 'machineId'"
                " FROM request r JOIN execution e ON e.request_id = r.id"
                " WHERE e.id = ANY(:ids)"
            ),
            {"ids": executions},
        ).all()
    assert sorted(tuple(r) for r in requests) == sorted(
        ("done", 3, None, machine) for machine in machines
    )
