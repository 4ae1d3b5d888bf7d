"""`orquestador dev` from an empty folder: embedded database, API, working tokens, clean stop."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def folder() -> Iterator[Path]:
    # Under root the embedded server runs as an unprivileged user, who must reach this folder.
    path = Path(tempfile.mkdtemp(prefix="orquestador-dev-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _environment(port: int) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "ORQUESTADOR_EMBEDDED_PG_USER")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["API_PORT"] = str(port)
    return env


def test_dev_serves_health_and_accepts_its_own_tokens_then_stops_cleanly(folder: Path) -> None:
    port = _free_port()
    env = _environment(port)
    process = subprocess.Popen(
        [*ORQUESTADOR, "dev"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _ = _get(f"{base}/healthz")
            except OSError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)
        if status != 200:
            process.kill()
            pytest.fail(f"no 200 from /healthz within 60 s:\n{process.communicate()[0]}")
        assert _get(f"{base}/readyz")[0] == 200

        minted = subprocess.run(
            [*ORQUESTADOR, "token", "--sub", "ana", "--org", "acme", "--scope", "requests:read"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert minted.returncode == 0, minted.stderr
        token = minted.stdout.strip()
        # A valid token reaches the resource check (404), an invalid one does not (401).
        assert _get(f"{base}/requests/{uuid.uuid4()}", token)[0] == 404
        assert _get(f"{base}/requests/{uuid.uuid4()}", token + "x")[0] == 401
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "DATABASE_URL: postgresql://" in output
    assert "token:" in output
    assert (folder / ".orquestador" / "pgdata" / "PG_VERSION").is_file()
    # The embedded server was stopped with the process.
    assert not (folder / ".orquestador" / "pgdata" / "postmaster.pid").exists()
    assert "Traceback" not in output
