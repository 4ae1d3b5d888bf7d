"""A worker killed in the middle of a dry run that rehearses a path: the next holder goes on
from what the rehearsed step answered, and the dry run ends where its outcomes lead."""

from __future__ import annotations

import copy
import json
import signal
from typing import Any

from sqlalchemy import Engine, text

from tests.acceptance.crash_support import blocked_inserting_into, spawn_worker
from tests.integration.approval_support import approval_flow
from tests.integration.worker_support import (
    accept_transition,
    audit,
    create_request,
    execution,
    publish_flow,
    request_row,
    wait_until,
)

WORKER = {"lease_seconds": 6, "renew_seconds": 2}


def _flow() -> dict[str, Any]:
    """Ask for an approval, then tell the panel: a dry run simulates the notice."""
    flow = copy.deepcopy(approval_flow())
    transition = flow["transitions"][0]
    transition["id"] = "go"
    transition["actions"].append(
        {
            "id": "tell",
            "capability": "notify",
            "version": 1,
            "input": {"title": {"const": "Reboot"}, "body": {"const": "decided"}},
        }
    )
    return flow


def test_sigkill_mid_dry_run_keeps_the_rehearsed_answer(
    database: Any, runtime_engine: Engine, owner_engine: Engine, tmp_path: Any
) -> None:
    flow_id = publish_flow(runtime_engine, _flow())
    request_id = create_request(runtime_engine, flow_id, simulation=True)
    execution_id = accept_transition(runtime_engine, request_id, simulation=True)
    with owner_engine.begin() as conn:  # what the dry-run route writes with the execution
        conn.execute(
            text("UPDATE execution SET rehearsal = CAST(:r AS jsonb) WHERE id = :id"),
            {"r": json.dumps({"ok": {"decision": "rejected"}}), "id": execution_id},
        )
    ledger = tmp_path / "ledger.jsonl"
    with owner_engine.connect() as holder, owner_engine.connect() as watcher:
        # The rehearsed step has answered; the simulated notice after it is held and the
        # victim dies writing it.
        holder.begin()
        holder.execute(text("LOCK TABLE panel_notice IN EXCLUSIVE MODE"))
        victim = spawn_worker(database, "", ledger, "victim", **WORKER)
        try:
            wait_until(
                lambda: blocked_inserting_into(watcher, "panel_notice"),
                what="the simulated notice to block",
            )
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
        finally:
            if victim.poll() is None:
                victim.kill()
        holder.rollback()

    survivor = spawn_worker(database, "", ledger, "survivor", **WORKER)
    try:
        wait_until(
            lambda: execution(runtime_engine, execution_id).status == "SUCCEEDED",
            timeout=60,
            what="the survivor to end the dry run",
        )
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(30)
    assert request_row(runtime_engine, request_id).state == "refused"
    simulated = [
        row.detail["actionId"] for row in audit(runtime_engine, execution_id, "ACTION_SIMULATED")
    ]
    # The rehearsed answer was kept, not played again; the notice was written once.
    assert sorted(simulated) == ["ok", "tell"]
    with runtime_engine.connect() as conn:
        notices = conn.execute(text("SELECT test FROM panel_notice")).scalars().all()
    assert notices == [True]
