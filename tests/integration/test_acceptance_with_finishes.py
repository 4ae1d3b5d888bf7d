"""Clients accepting transitions while a worker finishes them: no deadlock, no lost update."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import Effect
from orquestador.worker.daemon import Worker
from tests.integration.api_support import running_api
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import registry_of, settings, wait_until

CLIENTS = 12
REQUESTS = 10
ROUNDS = 20  # per client
TIME_LIMIT = 60.0  # seconds for all rounds together

# a -> b runs one quick read; b -> a runs nothing; both finish through the same lock
# order (request, then execution) while acceptances lock the request.
PING_PONG = {
    "key": "ping-pong",
    "trigger": "manual",
    "dataSchema": {"type": "object"},
    "initialState": "a",
    "states": ["a", "b"],
    "transitions": [
        {
            "id": "ab",
            "from": ["a"],
            "to": "b",
            "actions": [{"id": "look", "capability": "test.read", "version": 1, "input": {}}],
        },
        {"id": "ba", "from": ["b"], "to": "a", "actions": []},
    ],
}
NEXT = {"a": "ab", "b": "ba"}


@pytest.fixture
def workers(runtime_engine) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)


def _rows(engine: Engine, sql: str) -> list:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)))


def test_acceptances_racing_finishes_lose_no_update_and_never_deadlock(
    database, runtime_engine, workers, caplog
):
    caplog.set_level(logging.INFO, logger="orquestador")
    read = Double("test.read", Effect.READ_ONLY)
    registry = registry_of(read)
    worker = Worker(settings(worker_concurrency=4, worker_batch=4), runtime_engine, registry)
    worker.start()
    workers.append(worker)

    with running_api(database.runtime_dsn, registry=registry) as api:
        flow_id = api.publish(PING_PONG)["id"]
        request_ids = [api.create_request(flow_id, {})["id"] for _ in range(REQUESTS)]
        headers = api.headers()
        start = threading.Barrier(CLIENTS)
        answers: list[tuple[str, int, str | None]] = []  # (request id, status, problem code)
        failures: list[BaseException] = []
        deadline = time.monotonic() + TIME_LIMIT

        def hammer(number: int) -> None:
            client = api.client()
            try:
                start.wait(30)
                for round_ in range(ROUNDS):
                    if time.monotonic() > deadline:
                        return
                    request_id = request_ids[(number + round_) % REQUESTS]
                    current = client.get(f"/api/v1/requests/{request_id}", headers=headers)
                    assert current.status_code == 200, current.get_data(as_text=True)
                    seen = current.get_json()
                    response = client.post(
                        f"/api/v1/requests/{request_id}/transitions",
                        json={
                            "transition": NEXT[seen["state"]],
                            "expectedRevision": seen["revision"],
                        },
                        headers=headers,
                    )
                    body = response.get_json(silent=True) or {}
                    answers.append((request_id, response.status_code, body.get("code")))
            except BaseException as exc:  # reported by the test thread
                failures.append(exc)

        clients = [
            threading.Thread(target=hammer, args=(n,), name=f"client-{n}") for n in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(TIME_LIMIT + 30)
        assert not [c.name for c in clients if c.is_alive()]
        assert failures == []

        busy = "SELECT id FROM request WHERE busy_execution_id IS NOT NULL"
        wait_until(
            lambda: not _rows(runtime_engine, busy),
            timeout=60,
            what="every accepted transition finished",
        )

    statuses = Counter(status for _, status, _ in answers)
    assert set(statuses) <= {202, 409}, statuses
    assert {code for _, status, code in answers if status == 409} <= {
        "REVISION_CONFLICT",
        "REQUEST_BUSY",
    }
    # The race really happened: clients collided, and requests went round their cycle.
    assert statuses[409] > 0 and statuses[202] > REQUESTS, statuses
    accepted = Counter(request_id for request_id, status, _ in answers if status == 202)

    executions = _rows(
        runtime_engine, "SELECT request_id, transition_id, status, attempts FROM execution"
    )
    assert len(executions) == statuses[202]
    assert {(row.status, row.attempts) for row in executions} == {("SUCCEEDED", 1)}
    assert len(read.calls) == sum(1 for row in executions if row.transition_id == "ab")

    requests = {str(row.id): row for row in _rows(runtime_engine, "SELECT * FROM request")}
    completed: dict[str, list[int]] = {request_id: [] for request_id in request_ids}
    for row in _rows(
        runtime_engine,
        "SELECT request_id, detail FROM audit_event WHERE kind = 'TRANSITION_COMPLETED'",
    ):
        completed[str(row.request_id)].append(row.detail["revision"])
    for request_id in request_ids:
        n = accepted[request_id]
        row = requests[request_id]
        # Acceptance moves the revision once and the finish once more.
        assert row.revision == 1 + 2 * n, (request_id, row.revision, n)
        assert sorted(completed[request_id]) == [1 + 2 * k for k in range(1, n + 1)]
        assert row.state == ("a" if n % 2 == 0 else "b")
        assert row.busy_execution_id is None

    problems = [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING
        or "deadlock" in record.getMessage().lower()
        or "job ended by" in record.getMessage()
    ]
    assert problems == []
