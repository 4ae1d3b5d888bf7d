"""`orquestador api`: gunicorn serves the app on the runtime role and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

from tests.db_support import TestDatabase


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def test_gunicorn_serves_readiness_on_the_database_and_stops_on_sigterm(
    database: TestDatabase,
) -> None:
    port = _free_port()
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DATABASE_URL=database.runtime_dsn,
        API_PORT=str(port),
        API_WORKERS="1",
        REQUEST_API_ENABLED="true",
        JWT_SECRET="api-process-test-secret-0123456789",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "orquestador.cli", "api"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline and process.poll() is None and status != 200:
            status = _status(f"http://127.0.0.1:{port}/api/v1/readyz")
            time.sleep(0.1)
        assert status == 200
        assert _status(f"http://127.0.0.1:{port}/api/v1/requests/{uuid.uuid4()}") == 401
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output
