"""Real worker processes killed with SIGKILL around an e-mail's delivery: at least once, one ID.

Killed after the notice queued its e-mail and before the server took it: another
worker delivers it exactly once. Killed after the server took it and before the row
was marked sent: another worker delivers it again, with the same Message-ID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orquestador.notices.writing import message_id_for
from tests.integration.notice_support import make_outbox_due, outbox, set_preferences
from tests.integration.worker_support import (
    action,
    flow_definition,
    start_execution,
    status_is,
    wait_until,
)
from tests.smtp_sink import running_sink, silent_listener

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _spawn(database, smtp_url: str, started: list[subprocess.Popen]) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORKER_ENABLED": "true",
        "DATABASE_URL": database.runtime_dsn,
        "WORKER_LEASE_SECONDS": "30",
        "WORKER_RENEW_SECONDS": "5",
        "WORKER_POLL_MS": "100",
        "WORKER_DRAIN_SECONDS": "2",
        "SMTP_URL": smtp_url,
        "SMTP_FROM": "orquestador@example.com",
        "LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=env)
    started.append(process)
    return process


def _alive(process: subprocess.Popen, condition: Callable[[], Any]) -> Callable[[], Any]:
    """`condition`, failing at once when the process has ended instead of timing out."""

    def check() -> Any:
        assert process.poll() is None, f"the worker exited with {process.returncode}"
        return condition()

    return check


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL


def _queue_by_a_flow(engine) -> str:
    """Run notify with e-mail ticked; the external key of its step."""
    set_preferences(engine)
    inputs = {"title": {"const": "Reinstall finished"}, "body": {"const": "m-1 is back."}}
    inputs["email"] = {"const": True}
    execution_id = start_execution(
        engine, flow_definition([action("tell", "notify", input=inputs)])
    )
    return str(execution_id)


def test_a_worker_killed_before_delivery_leaves_the_email_to_another_once(
    database, runtime_engine, processes
):
    execution_id = _queue_by_a_flow(runtime_engine)
    with silent_listener() as (port, accepted):
        victim = _spawn(database, f"smtp://127.0.0.1:{port}", processes)
        notice_written = status_is(runtime_engine, execution_id, "SUCCEEDED")
        wait_until(_alive(victim, notice_written), timeout=60, what="the notice")
        # The victim claimed the e-mail and waits for a greeting that never comes.
        claimed = lambda: accepted and outbox(runtime_engine)[0].lease_owner  # noqa: E731
        wait_until(_alive(victim, claimed), timeout=30, what="the claim")
        _kill(victim)
    [row] = outbox(runtime_engine)
    assert (row.status, row.attempts) == ("pending", 1)

    make_outbox_due(runtime_engine)  # the dead worker's lease runs out
    with running_sink() as sink:
        survivor = _spawn(database, sink.url, processes)
        [received] = sink.wait_for(1, timeout=60)
        wait_until(lambda: outbox(runtime_engine)[0].status == "sent", timeout=30, what="sent")
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(30) == 0
        assert len(sink.received()) == 1

    assert received.message_id == message_id_for(f"{execution_id}:tell")
    [row] = outbox(runtime_engine)
    assert (row.attempts, row.lease_owner) == (2, None)


def test_a_worker_killed_after_the_server_took_the_email_redelivers_the_same_message_id(
    database, runtime_engine, processes
):
    execution_id = _queue_by_a_flow(runtime_engine)
    with running_sink() as sink:
        sink.holding.set()  # the server records the message and holds its "250 OK"
        victim = _spawn(database, sink.url, processes)
        sink.wait_for(1, timeout=60)
        _kill(victim)
        sink.holding.clear()
        assert outbox(runtime_engine)[0].status == "pending"

        make_outbox_due(runtime_engine)
        _spawn(database, sink.url, processes)
        first, second = sink.wait_for(2, timeout=60)
        wait_until(lambda: outbox(runtime_engine)[0].status == "sent", timeout=30, what="sent")
        assert len(sink.received()) == 2

    assert first.message_id == second.message_id == message_id_for(f"{execution_id}:tell")
    assert outbox(runtime_engine)[0].attempts == 2
