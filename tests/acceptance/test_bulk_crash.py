"""A worker killed with SIGKILL in the middle of a bulk action: a new worker finishes the bulk and
every item is acted on exactly once, the one the victim was acting on included."""

from __future__ import annotations

import signal
import uuid
from typing import Any

from sqlalchemy import Engine, text

from tests.acceptance.crash_support import spawn_worker
from tests.integration.api_support import running_api
from tests.integration.bulk_support import arrange, audits, items, publish, statuses
from tests.integration.worker_support import ORG, wait_until

OPERATOR: dict[str, Any] = {"org": ORG, "sub": "carol", "scopes": ["executions:cancel"]}
ITEMS = 300
HELD = 150


def _done(engine: Engine, bulk_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM bulk_item WHERE bulk_id = :id AND outcome IS NOT NULL"),
            {"id": uuid.UUID(bulk_id)},
        ).scalar_one()


def _lock_waiters(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalars()
        )


def _backend_alive(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        )


def _bulk_status(engine: Engine, bulk_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status FROM bulk_action WHERE id = :id"), {"id": uuid.UUID(bulk_id)}
        ).scalar_one()


def test_sigkill_mid_bulk_then_a_new_worker_acts_on_every_item_exactly_once(
    database, owner_engine, processes, tmp_path
):
    ledger = tmp_path / "ledger.jsonl"
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, ITEMS)
    with running_api(database.runtime_dsn) as api:
        response = api.post(
            "/executions/bulk",
            {"filter": {"flowId": str(flow)}, "action": "cancel", "reason": "maintenance"},
            **OPERATOR,
        )
    assert response.status_code == 202, response.get_data(as_text=True)
    bulk_id = response.get_json()["bulkId"]

    # The worker takes the items in execution id order; the request of the 151st is
    # locked here, so the victim is caught in the middle of that item's transaction.
    held = pending[HELD]
    holder = owner_engine.connect()
    holding = holder.begin()
    holder.execute(
        text("SELECT id FROM request WHERE busy_execution_id = :id FOR UPDATE"), {"id": held}
    )
    victim = spawn_worker(database, "", ledger, "victim")
    processes.append(victim)
    wait_until(
        lambda: _done(owner_engine, bulk_id) == HELD and _lock_waiters(owner_engine),
        timeout=60,
        what="the victim to act on the items before the held one, then wait for it",
    )
    (orphan,) = _lock_waiters(owner_engine)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    holding.rollback()
    holder.close()
    # The victim's server process ends once it finds its client gone: the item's
    # transaction is rolled back with everything the cancel had done in it.
    wait_until(lambda: not _backend_alive(owner_engine, orphan), what="the orphan to end")

    assert _done(owner_engine, bulk_id) == HELD
    assert items(owner_engine, bulk_id)[held].outcome is None
    assert statuses(owner_engine, [held]) == {held: "PENDING"}
    assert set(audits(owner_engine, "EXECUTION_CANCELLED")) == set(pending[:HELD])
    assert _bulk_status(owner_engine, bulk_id) == "RUNNING"

    survivor = spawn_worker(database, "", ledger, "survivor")
    processes.append(survivor)
    wait_until(
        lambda: _bulk_status(owner_engine, bulk_id) == "DONE", timeout=60, what="the bulk's end"
    )
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(30) == 0

    outcomes = items(owner_engine, bulk_id)
    assert {row.outcome for row in outcomes.values()} == {"SUCCEEDED"}
    assert set(statuses(owner_engine, pending).values()) == {"CANCELLED"}
    cancelled = audits(owner_engine, "EXECUTION_CANCELLED")
    assert set(cancelled) == set(pending)
    assert all(len(rows) == 1 for rows in cancelled.values())
    assert {rows[0].detail["bulkId"] for rows in cancelled.values()} == {bulk_id}
