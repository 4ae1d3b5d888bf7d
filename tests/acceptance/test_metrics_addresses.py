"""Metrics listen where the operator says: METRICS_BIND takes the API's /metrics off its
public port; an address or port already taken stops the process with one line (exit
status 2), never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.proxy_support import ROOT, free_port, running_api, status_of, wait_for
from tests.db_support import TestDatabase

JWT_SECRET = "metrics-address-test-signing-key-012345"


def _api_env(database: TestDatabase, port: int, **more: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database.runtime_dsn,
        "API_PORT": str(port),
        "API_WORKERS": "2",
        "REQUEST_API_ENABLED": "true",
        "JWT_SECRET": JWT_SECRET,
        **more,
    }


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield int(holder.getsockname()[1])


def test_metrics_bind_serves_metrics_off_the_api_port(
    database: TestDatabase, tmp_path: Path
) -> None:
    port, metrics = free_port(), free_port()
    env = _api_env(database, port, METRICS_BIND=f"127.0.0.1:{metrics}")
    with running_api(env, tmp_path / "api.log"):
        wait_for(lambda: status_of(f"http://127.0.0.1:{port}/api/v1/healthz") == 200, 60, "API")
        assert status_of(f"http://127.0.0.1:{port}/metrics") == 404
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as scrape:
            text = scrape.read().decode()
    # What the workers counted (the probe above), summed by the one listener of the host.
    assert 'orquestador_http_requests_total{route="/api/v1/healthz",status="200"}' in text


def _one_line_and_status_2(process: subprocess.Popen[bytes], log: Path) -> str:
    assert process.wait(60) == 2
    output = log.read_text()
    assert "Traceback" not in output, output
    return output


def test_a_taken_metrics_bind_stops_the_api_with_one_line(
    database: TestDatabase, tmp_path: Path, taken_port: int
) -> None:
    port = free_port()
    env = _api_env(database, port, METRICS_BIND=f"127.0.0.1:{taken_port}")
    with running_api(env, tmp_path / "api.log") as process:
        output = _one_line_and_status_2(process, tmp_path / "api.log")
    (line,) = [line for line in output.splitlines() if "METRICS_BIND" in line]
    assert f"METRICS_BIND=127.0.0.1:{taken_port}: cannot listen there" in line


def test_a_taken_worker_metrics_port_stops_the_worker_with_one_line(
    database: TestDatabase, tmp_path: Path, taken_port: int
) -> None:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "orquestador.cli", "worker"],
            cwd=ROOT,
            env={
                **base,
                "PYTHONPATH": str(ROOT),
                "WORKER_ENABLED": "true",
                "DATABASE_URL": database.runtime_dsn,
                "WORKER_METRICS_PORT": str(taken_port),
            },
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        output_text = _one_line_and_status_2(process, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    (line,) = [line for line in output_text.splitlines() if "WORKER_METRICS_PORT" in line]
    assert line.startswith(f"orquestador: WORKER_METRICS_PORT={taken_port}: cannot listen on")
