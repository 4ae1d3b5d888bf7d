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
