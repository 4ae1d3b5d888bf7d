"""A worker killed in the middle of an approval's first round: nothing half written, the next
holder asks once (one approval, one e-mail), and the decision ends the execution."""

from __future__ import annotations

import copy
import signal
from typing import Any

from sqlalchemy import Engine, text

from orquestador.approvals.access import ApprovalAccess
from orquestador.approvals.store import record_decision
from tests.acceptance.crash_support import blocked_inserting_into, spawn_worker
from tests.integration.approval_support import approval_flow
from tests.integration.worker_support import (
    ORG,
    accept_transition,
    create_request,
    execution,
    publish_flow,
    wait_until,
)

# The built-ins' call timeout is half the lease: the kill comes well before it.
WORKER = {"lease_seconds": 6, "renew_seconds": 2}


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_sigkill_mid_round_leaves_one_approval_and_one_email(
    database: Any, runtime_engine: Engine, owner_engine: Engine, tmp_path: Any
) -> None:
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notification_preference (org_id, recipients)"
                " VALUES (:org, '[\"ops@example.com\"]')"
            ),
            {"org": ORG},
        )
    flow = copy.deepcopy(approval_flow(email=True))
    flow["transitions"][0]["id"] = "go"
    execution_id = accept_transition(
        runtime_engine, create_request(runtime_engine, publish_flow(runtime_engine, flow))
    )
    ledger = tmp_path / "ledger.jsonl"
    with owner_engine.connect() as holder, owner_engine.connect() as watcher:
        # The round writes the approval, then its notice: held at the notice, in the
        # middle of the round's one transaction, the victim dies.
        holder.begin()
        holder.execute(text("LOCK TABLE panel_notice IN EXCLUSIVE MODE"))
        victim = spawn_worker(database, "", ledger, "victim", **WORKER)
        try:
            wait_until(
                lambda: blocked_inserting_into(watcher, "panel_notice"), what="the round to block"
            )
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
        finally:
            if victim.poll() is None:
                victim.kill()
        holder.rollback()
    # Its transaction died with it: no approval, no notice, no e-mail.
    assert [_count(runtime_engine, t) for t in ("approval", "panel_notice", "email_outbox")] == [
        0,
        0,
        0,
    ]

    survivor = spawn_worker(database, "", ledger, "survivor", **WORKER)
    try:
        wait_until(
            lambda: execution(runtime_engine, execution_id).status == "WAITING",
            timeout=60,
            what="the survivor to ask again and wait",
        )
        with runtime_engine.begin() as conn:
            (approval_id,) = conn.execute(text("SELECT id FROM approval")).scalars()
            row = ApprovalAccess(ORG, "bob", []).find(conn, approval_id, lock=True)
            assert row is not None
            assert record_decision(conn, row, "bob", "approved", "after the crash") is not None
        wait_until(
            lambda: execution(runtime_engine, execution_id).status == "SUCCEEDED",
            timeout=30,
            what="the decision to end it",
        )
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(30)
    assert [_count(runtime_engine, t) for t in ("approval", "panel_notice", "email_outbox")] == [
        1,
        1,
        1,
    ]
