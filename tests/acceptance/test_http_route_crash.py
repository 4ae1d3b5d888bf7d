"""A worker killed with SIGKILL while an HTTP route's write is in flight: one effect per key.

The route is configured as an operator would (INTEGRATIONS_FILE, a NON_IDEMPOTENT_WRITE
with a lookup by idempotency key) and the provider double is a real HTTP server. The
double performs the first writes and then holds their answers; the worker making
each of those calls is killed mid-call and replaced. The replacement looks the writes
up, finds them, and goes on: every execution succeeds, and the provider performed
each key's write exactly once and was never sent one again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sqlalchemy import text

from tests.integration.route_provider import HANG, RouteProvider
from tests.integration.worker_support import (
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
EXECUTIONS = 6
HELD = 2

ROUTES = """
[[route]]
capability = "billing.invoice"
version = 1
effect = "NON_IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/invoices"
headers = { Authorization = "Bearer ${BILLING_TOKEN}", X-Worker = "${WORKER_TAG}" }
timeout_seconds = 2
max_attempts = 5
output_schema = { type = "object", required = ["id"] }
response = { id = "/id" }
lookup = { url = "${BILLING_URL}/v1/invoices?idempotency_key={externalKey}", found = "/data/0" }
"""


def _spawn(database, provider: RouteProvider, routes: Path, tag: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORKER_ENABLED": "true",
        "DATABASE_URL": database.runtime_dsn,
        "WORKER_LEASE_SECONDS": "3",
        "WORKER_RENEW_SECONDS": "1",
        "WORKER_CONCURRENCY": "4",
        "WORKER_BATCH": "4",
        "WORKER_POLL_MS": "100",
        "WORKER_DRAIN_SECONDS": "2",
        "RETRY_BASE_SECONDS": "0.05",
        "RETRY_CAP_SECONDS": "0.2",
        "INTEGRATIONS_FILE": str(routes),
        "BILLING_URL": provider.url,
        "BILLING_TOKEN": "secret-token",
        "WORKER_TAG": tag,
        "LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=env)


def test_sigkill_mid_call_leaves_exactly_one_effect_per_external_key(
    database, runtime_engine, processes, tmp_path
):
    routes = tmp_path / "integrations.toml"
    routes.write_text(ROUTES)
    with RouteProvider(hang_seconds=20).serve() as provider:
        provider.then(*[HANG] * HELD)
        flow = publish_flow(
            runtime_engine,
            flow_definition(
                [action("charge", "billing.invoice", input={"n": {"from": "/data/n"}})]
            ),
        )
        executions = [
            accept_transition(runtime_engine, create_request(runtime_engine, flow, {"n": n}))
            for n in range(EXECUTIONS)
        ]
        workers: dict[str, subprocess.Popen] = {}
        for tag in ("first", "second"):
            workers[tag] = _spawn(database, provider, routes, tag)
            processes.append(workers[tag])

        # Both held writes are in flight at once (the route's timeout would end a hold
        # after 2 s): kill every worker holding one, then replace each.
        def both_held() -> list | None:
            holding = provider.held()
            return holding if len(holding) == HELD else None

        held = wait_until(
            both_held,
            timeout=20,
            what="the first writes held mid-call",
        )
        killed = [r.headers["Idempotency-Key"] for r in held]
        for tag in {r.headers["X-Worker"] for r in held}:
            victim = workers.pop(tag)
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            workers[f"after-{tag}"] = _spawn(database, provider, routes, f"after-{tag}")
            processes.append(workers[f"after-{tag}"])

        def all_succeeded() -> bool:
            with runtime_engine.connect() as conn:
                statuses = dict(conn.execute(text("SELECT id, status FROM execution")).all())
            return all(statuses[e] == "SUCCEEDED" for e in executions)

        wait_until(all_succeeded, timeout=25, what="every execution to succeed")
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            worker.wait(20)

    keys = {f"{e}:charge" for e in executions}
    assert provider.effects == Counter(dict.fromkeys(keys, 1))
    assert sum(provider.repeats.values()) == 0, provider.repeats
    assert set(killed) <= keys
    with runtime_engine.connect() as conn:
        found = {
            detail["externalKey"]
            for (detail,) in conn.execute(
                text("SELECT detail FROM audit_event WHERE kind = 'RECONCILED_BY_LOOKUP'")
            )
        }
        outputs = dict(
            conn.execute(text("SELECT external_key, output FROM action_execution")).all()
        )
    # The writes whose callers were killed were settled by the route's lookup.
    assert set(killed) <= found
    assert {k: o["id"] for k, o in outputs.items()} == {
        k: r["id"] for k, r in provider.records.items()
    }
