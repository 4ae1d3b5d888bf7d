"""Worker processes killed with SIGKILL again and again, mid-call; lookups settle every doubt.

Every action is a NON_IDEMPOTENT_WRITE to a provider double that counts the writes it
performs per key; the adapter can look a write up by its external key. Workers are
killed while calls are in flight (before the provider performs the write, or after it
did and before the answer arrives) and at other moments, and replaced. At the end
nothing waits for a person, every key's write was performed exactly once and never
sent again once performed, and every write whose answer was lost was settled by a
lookup, as the audit shows.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text

from tests.acceptance.provider_double import AFTER, BEFORE, ProviderDouble
from tests.integration.worker_support import (
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
EXECUTIONS = 40
ACTIONS = ("charge", "ship")
KILLS = 6  # the first two on each side of a write; the promise checker kills at random too
KILLING_FOR = 35.0  # seconds: no new kill after this
ANYWHERE = "anywhere"  # a live worker, right after the provider answered a few more writes


def _spawn(database, provider: ProviderDouble) -> subprocess.Popen:
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
        "WORKER_DRAIN_SECONDS": "5",
        "RETRY_BASE_SECONDS": "0.05",
        "RETRY_CAP_SECONDS": "0.2",
        "ADAPTER_ABANDON_GRACE_SECONDS": "1",
        "ADAPTER_MODULES": "tests.acceptance.lookup_adapters",
        "LOOKUP_PROVIDER_URL": provider.url,
        "LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=env)


def _rows(engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text(sql)).all()


def _all_ended(engine, executions: list) -> bool:
    statuses = dict(_rows(engine, "SELECT id, status FROM execution"))
    return all(
        statuses[e] in ("SUCCEEDED", "FAILED", "RECONCILIATION_REQUIRED") for e in executions
    )


def test_repeated_sigkill_mid_call_leaves_nothing_for_a_person_and_nothing_written_twice(
    database, runtime_engine, processes
):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    why = f"(seed {seed})"
    with ProviderDouble(seed).serve() as provider:
        flow = publish_flow(
            runtime_engine,
            flow_definition(
                [action(a, "provider.write", input={"n": {"from": "/data/n"}}) for a in ACTIONS]
            ),
        )
        executions = [
            # Claims to spare: every kill costs the executions it held one claim.
            accept_transition(
                runtime_engine, create_request(runtime_engine, flow, {"n": n}), max_attempts=50
            )
            for n in range(EXECUTIONS)
        ]
        workers: dict[int, subprocess.Popen] = {}
        for _ in range(2):
            worker = _spawn(database, provider)
            processes.append(worker)
            workers[worker.pid] = worker

        def victim(mode: str, after_answers: int) -> int | str | None:
            if _all_ended(runtime_engine, executions):
                return "done"
            if provider.answered_count() < after_answers:
                return None
            if mode == ANYWHERE:
                return rng.choice(sorted(workers))
            calls = [c for c in provider.in_flight() if c.phase == mode and c.pid in workers]
            return calls[0].pid if calls else None

        # The first two kills land mid-call, one on each side of the write; then any.
        modes = [AFTER, BEFORE] + [rng.choice([AFTER, BEFORE, ANYWHERE]) for _ in range(KILLS - 2)]
        kills: list[str] = []
        started = time.monotonic()
        for mode in modes:
            if time.monotonic() - started > KILLING_FOR:
                break
            after_answers = provider.answered_count() + rng.randint(1, 4)
            target = wait_until(
                lambda mode=mode, after=after_answers: victim(mode, after),
                timeout=30,
                what=f"a worker to kill ({mode}) {why}",
            )
            if target == "done":
                break
            assert isinstance(target, int)
            killed = workers.pop(target)
            killed.send_signal(signal.SIGKILL)
            killed.wait(10)
            kills.append(mode)
            replacement = _spawn(database, provider)
            processes.append(replacement)
            workers[replacement.pid] = replacement

        wait_until(
            lambda: _all_ended(runtime_engine, executions),
            timeout=60,
            what=f"every execution to end {why}",
        )
        # (A replacement may still be starting: its exit status says nothing here.)
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            worker.wait(30)

    statuses = Counter(
        status for _, status in _rows(runtime_engine, "SELECT id, status FROM execution")
    )
    assert statuses == Counter({"SUCCEEDED": EXECUTIONS}), f"left for a person or failed {why}"
    assert not _rows(runtime_engine, "SELECT id FROM request WHERE busy_execution_id IS NOT NULL")

    # The provider performed each key's write exactly once, and no write was sent again
    # once it had been performed.
    keys = {f"{e}:{a}" for e in executions for a in ACTIONS}
    assert provider.performed == Counter(dict.fromkeys(keys, 1)), why
    assert sum(provider.repeats.values()) == 0, f"writes sent again: {provider.repeats} {why}"

    # Every step holds what the provider has under its key, however it learnt it.
    steps = _rows(runtime_engine, "SELECT external_key, status, output FROM action_execution")
    assert {s.external_key: (s.status, s.output) for s in steps} == {
        key: ("SUCCEEDED", provider.record(key)) for key in keys
    }, why

    # Each write whose answer was lost was settled by a lookup, once, and audited.
    audited = [
        detail
        for (detail,) in _rows(
            runtime_engine,
            "SELECT detail FROM audit_event WHERE kind = 'RECONCILED_BY_LOOKUP' ORDER BY id",
        )
    ]
    assert all(set(d) == {"actionId", "attempt", "externalKey"} for d in audited), why
    reconciled = Counter(d["externalKey"] for d in audited)
    assert all(count == 1 for count in reconciled.values()), why
    assert provider.unanswered <= set(reconciled), (
        f"answers lost without a lookup: {provider.unanswered - set(reconciled)} {why}"
    )
    found_lines = {
        f"{t.execution_id}:{t.action_id}"
        for t in _rows(
            runtime_engine,
            "SELECT execution_id, action_id FROM action_attempt "
            "WHERE status = 'SUCCEEDED' AND message LIKE 'found by lookup%'",
        )
    }
    assert found_lines == set(reconciled), why

    # The kills landed mid-call on both sides of the write, and lookups settled both.
    assert kills[:2] == [AFTER, BEFORE], f"kills: {kills} {why}"
    assert provider.caller_gone_after_write, f"no caller died after its write {why}"
    assert provider.caller_gone_before_write, f"no caller died before its write {why}"
    assert reconciled, why
    # A caller that died before its write was looked up, found nothing, and wrote again.
    assert provider.not_found_answers, why
