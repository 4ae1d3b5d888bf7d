"""`orquestador dev` honours both metrics endpoints: the API's /metrics and WORKER_METRICS_PORT."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy import text as sql

from tests.db_support import TestDatabase

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def test_dev_serves_api_and_worker_metrics_and_names_them(
    database: TestDatabase, tmp_path: Path
) -> None:
    api_port, metrics_port = _free_port(), _free_port()
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DATABASE_URL=database.runtime_dsn,
        MIGRATION_DATABASE_URL=database.owner_dsn,
        API_PORT=str(api_port),
        WORKER_METRICS_PORT=str(metrics_port),
        MAINTENANCE_INTERVAL_SECONDS="1",
    )
    process = subprocess.Popen(
        [*ORQUESTADOR, "dev"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    api = f"http://127.0.0.1:{api_port}"
    worker = f"http://127.0.0.1:{metrics_port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _get(f"{api}/api/v1/healthz")[0] != 200:
            assert process.poll() is None
            time.sleep(0.2)
        assert _get(f"{api}/api/v1/healthz")[0] == 200

        # The API's endpoint: this request, by route template.
        status, text = _get(f"{api}/metrics")
        assert status == 200
        assert 'orquestador_http_requests_total{route="/api/v1/healthz",status="200"}' in text
        # The worker's own endpoint: its series, its readiness, and the leader's gauges.
        leader = re.compile(r"^orquestador_maintenance_leader 1\.0$", re.MULTILINE)
        sampled = 'orquestador_queue_depth{status="PENDING"} 0.0'
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, text = _get(f"{worker}/metrics")
            if leader.search(text) and sampled in text:
                break
            time.sleep(0.2)
        assert leader.search(text) and sampled in text, text
        assert _get(f"{worker}/readyz")[0] == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    (line,) = [line for line in output.splitlines() if line.strip().startswith("metrics:")]
    assert f"{api}/metrics" in line and f"{worker}/metrics" in line
    assert "Traceback" not in output


def _scrape_until(url: str, wanted: re.Pattern[str], seconds: float) -> tuple[bool, str]:
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        text = _get(url)[1]
        if wanted.search(text):
            return True, text
        time.sleep(0.2)
    return False, text


def test_queue_gauges_are_seconds_old_and_ends_are_counted_apart_from_moves(
    database: TestDatabase, owner_engine: Engine, tmp_path: Path
) -> None:
    from tests.integration.worker_support import (
        create_request,
        flow_definition,
        publish_flow,
        start_execution,
    )

    api_port, metrics_port = _free_port(), _free_port()
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    # The maintenance pass keeps its default minute: only the gauge loop can be this quick.
    env.update(
        DATABASE_URL=database.runtime_dsn,
        MIGRATION_DATABASE_URL=database.owner_dsn,
        API_PORT=str(api_port),
        WORKER_METRICS_PORT=str(metrics_port),
    )
    process = subprocess.Popen(
        [*ORQUESTADOR, "dev"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        ready, text = _scrape_until(
            worker, re.compile(r'^orquestador_queue_depth\{status="PENDING"\} 0\.0$', re.M), 90
        )
        assert ready, text
        # Not due for an hour: it stays PENDING, counted by the gauge and run by no one.
        request_id = create_request(owner_engine, publish_flow(owner_engine, flow_definition([])))
        with owner_engine.begin() as conn:
            conn.execute(
                sql(
                    "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                    " accepted_revision, accepted_state, max_attempts, next_attempt_at,"
                    " actor_snapshot)"
                    " SELECT id, org_id, flow_id, 'go', revision, state, 10,"
                    " now() + interval '1 hour', '{\"sub\": \"alice\"}'"
                    " FROM request WHERE id = :id"
                ),
                {"id": request_id},
            )
        added = time.monotonic()
        seen, text = _scrape_until(
            worker, re.compile(r'^orquestador_queue_depth\{status="PENDING"\} 1\.0$', re.M), 30
        )
        assert seen, text
        # A gauge at most 5 s old (one sample, one scrape and a busy machine on top), far
        # from the minute the maintenance pass would take.
        assert time.monotonic() - added < 15

        # One execution that ends: one end counted, by its final status.
        start_execution(owner_engine, flow_definition([]))
        ended, text = _scrape_until(
            worker,
            re.compile(r'^orquestador_executions_finished_total\{status="SUCCEEDED"\} 1\.0$', re.M),
            30,
        )
        assert ended, text
        assert 'orquestador_executions_finished_total{status="WAITING"}' not in text
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
