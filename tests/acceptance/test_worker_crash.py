"""Two real worker processes; one is killed with SIGKILL mid-action; the other recovers all."""

from __future__ import annotations

import signal
from collections import Counter

from sqlalchemy import text

from tests.acceptance.crash_support import read_ledger, spawn_worker
from tests.integration.worker_support import (
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    wait_until,
)

ADAPTERS = "tests.acceptance.crash_adapters"
LEASE = {"lease_seconds": 3, "renew_seconds": 1}
TERMINAL = ("SUCCEEDED", "FAILED", "RECONCILIATION_REQUIRED")


def _statuses(engine) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT id, status FROM execution")).all())


def test_sigkill_mid_action_is_recovered_without_repeating_work(
    database, runtime_engine, processes, tmp_path
):
    ledger = tmp_path / "ledger.jsonl"
    hold_flow = publish_flow(
        runtime_engine,
        flow_definition(
            [action("w1", "crash.write"), action("hold", "crash.hold"), action("w2", "crash.write")]
        ),
    )
    charge_flow = publish_flow(runtime_engine, flow_definition([action("charge", "crash.charge")]))
    plain_flow = publish_flow(runtime_engine, flow_definition([action("w", "crash.write")]))
    # The victim claims first and fills its two slots with the two blocking kinds.
    charged = accept_transition(runtime_engine, create_request(runtime_engine, charge_flow))
    held = accept_transition(runtime_engine, create_request(runtime_engine, hold_flow))
    victim = spawn_worker(database, ADAPTERS, ledger, "victim", concurrency=2, **LEASE)
    processes.append(victim)
    wait_until(
        lambda: (
            sum(
                1
                for e in read_ledger(ledger)
                if e["role"] == "victim"
                and e["capability"] != "crash.write"
                and e["event"] == "start"
            )
            == 2
        ),
        timeout=60,
        what="the victim blocked in both actions",
    )

    others = [
        accept_transition(runtime_engine, create_request(runtime_engine, flow))
        for flow in [hold_flow, charge_flow, plain_flow] * 8
    ]
    survivor = spawn_worker(database, ADAPTERS, ledger, "survivor", concurrency=6, **LEASE)
    processes.append(survivor)
    wait_until(
        lambda: all(_statuses(runtime_engine)[e] in TERMINAL for e in others),
        timeout=60,
        what="the survivor ran the rest",
    )

    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_until(
        lambda: all(s in TERMINAL for s in _statuses(runtime_engine).values()),
        timeout=60,
        what="recovery of the victim's executions",
    )

    statuses = _statuses(runtime_engine)
    assert statuses[held] == "SUCCEEDED"
    assert statuses[charged] == "RECONCILIATION_REQUIRED"
    expected_parked = {charged} | {e for e in others if statuses[e] == "RECONCILIATION_REQUIRED"}
    assert expected_parked == {charged}, "only the interrupted non-idempotent write is parked"

    entries = read_ledger(ledger)
    starts = Counter(e["key"] for e in entries if e["event"] == "start")
    ends = Counter(e["key"] for e in entries if e["event"] == "end")
    assert all(count == 1 for count in ends.values()), "an action succeeded twice"
    for key in starts:
        if ends[key]:
            # once it succeeded it never ran again; an interrupted safe write ran at most twice
            first_end = next(
                i for i, e in enumerate(entries) if e["key"] == key and e["event"] == "end"
            )
            assert not any(
                e["key"] == key and e["event"] == "start" for e in entries[first_end:]
            ), key
    charges = [e for e in entries if e["capability"] == "crash.charge" and e["event"] == "start"]
    assert Counter(e["key"] for e in charges).most_common(1)[0][1] == 1, "a charge ran twice"
    assert starts[f"{held}:hold"] == 2 and starts[f"{held}:w1"] == 1
    with runtime_engine.connect() as conn:
        busy = conn.execute(
            text(
                "SELECT busy_execution_id FROM request r JOIN execution e "
                "ON e.request_id = r.id WHERE e.id = :id"
            ),
            {"id": charged},
        ).scalar()
        tokens = conn.execute(
            text("SELECT fencing_token FROM execution WHERE id = :id"), {"id": held}
        ).scalar()
    assert busy == charged and tokens == 2

    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(30) == 0
