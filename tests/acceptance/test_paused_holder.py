"""A worker frozen (SIGSTOP) past its lease between its last deadline check and its send.

Worker A starts a non-idempotent charge and is frozen before its request leaves; its
lease lapses and worker B reclaims. B's look-up truthfully answers NotFound, but A may
still send: B must not charge again before A's attempt can no longer send (its start +
the adapter's timeout + ADAPTER_ABANDON_GRACE_SECONDS). A wakes and sends within that
time; B's next look-up finds A's charge. A strict provider, which performs every charge
that arrives, performs this key's charge once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import text

from tests.acceptance.provider_double import Instruction, ProviderDouble
from tests.integration.worker_support import (
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
GRACE_SECONDS = 10  # wide: a slow machine must not let B outwait a short pause


def _spawn(database: Any, provider: ProviderDouble, pause_dir: Path | None) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORKER_ENABLED": "true",
        "DATABASE_URL": database.runtime_dsn,
        "WORKER_LEASE_SECONDS": "3",
        "WORKER_RENEW_SECONDS": "1",
        "WORKER_POLL_MS": "100",
        "WORKER_DRAIN_SECONDS": "2",
        "RETRY_BASE_SECONDS": "0.05",
        "RETRY_CAP_SECONDS": "0.2",
        "ADAPTER_ABANDON_GRACE_SECONDS": str(GRACE_SECONDS),
        "ADAPTER_MODULES": "tests.acceptance.paused_adapters",
        "PAUSE_PROVIDER_URL": provider.url,
        "LOG_LEVEL": "WARNING",
    }
    env.pop("PAUSE_AT_SEND_DIR", None)
    if pause_dir is not None:
        env["PAUSE_AT_SEND_DIR"] = str(pause_dir)
    return subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=env)


def _execution(engine: Any, execution_id: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM execution WHERE id = :id"), {"id": execution_id}
        ).one()


def test_a_paused_holder_that_sends_late_is_found_not_charged_again(
    database, runtime_engine, processes, tmp_path
):
    with ProviderDouble(0, instructions=lambda call: Instruction()).serve() as provider:
        flow = publish_flow(
            runtime_engine,
            flow_definition([action("charge", "provider.charge", input={"n": {"const": 1}})]),
        )
        eid = accept_transition(runtime_engine, create_request(runtime_engine, flow, {}))
        key = f"{eid}:charge"

        first = _spawn(database, provider, tmp_path)
        processes.append(first)
        marker = tmp_path / f"{first.pid}.at-send"
        wait_until(marker.exists, timeout=30, what="worker A to reach its send")
        first.send_signal(signal.SIGSTOP)  # a GC pause, a frozen VM
        try:
            (tmp_path / "go").write_text("")  # A goes on only once it runs again
            second = _spawn(database, provider, None)
            processes.append(second)
            # B reclaims once A's lease lapsed and asks the provider, which has nothing.
            wait_until(
                lambda: any(line.lookup for line in provider.ledger(key)),
                timeout=30,
                what="worker B to look the charge up",
            )
            wait_until(
                lambda: _execution(runtime_engine, eid).status != "RUNNING",
                timeout=30,
                what="worker B to act on its look-up",
            )
        finally:
            first.send_signal(signal.SIGCONT)
        # A sends the request it had ready (nothing in it looks at the deadline again).
        wait_until(
            lambda: any(
                line.event == "arrived" and not line.lookup and line.pid == first.pid
                for line in provider.ledger(key)
            ),
            timeout=30,
            what="worker A to send",
        )
        assert provider.wait_until_idle(30)
        wait_until(
            lambda: _execution(runtime_engine, eid).status in ("SUCCEEDED", "FAILED"),
            timeout=60,
            what="the execution to end",
        )
        performed = [line for line in provider.ledger(key) if line.event == "performed"]
        for worker in (first, second):
            worker.send_signal(signal.SIGTERM)
        for worker in (first, second):
            worker.wait(30)

    row = _execution(runtime_engine, eid)
    ledger = "\n".join(str(line) for line in provider.ledger(key))
    assert len(performed) == 1, f"the charge was performed {len(performed)} times:\n{ledger}"
    assert row.status == "SUCCEEDED", ledger
    with runtime_engine.connect() as conn:
        (output,) = conn.execute(
            text("SELECT output FROM action_execution WHERE execution_id = :id"), {"id": eid}
        ).one()
        waited = conn.execute(
            text(
                "SELECT detail FROM audit_event WHERE execution_id = :id"
                " AND kind = 'EARLIER_CALL_PENDING'"
            ),
            {"id": eid},
        ).all()
    # B learnt A's charge by its look-up, after waiting for A's call to be unable to send.
    assert output == provider.record(key)
    assert waited and waited[0].detail["actionId"] == "charge"
