"""The reference agent as a real process with an enrolled token, as an operator sets it
up: it keeps working across API restarts (a new API instance knows the credential from
the database), and stops at its next request once the machine is revoked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.machines import create_command
from orquestador.serve import serve_in_thread
from tests.integration.api_support import SECRET, api_settings

ROOT = Path(__file__).resolve().parents[2]
ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
ORG = "acme"
COMMANDS = '[poweroff]\nargv = ["true"]\ntimeout_seconds = 10\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RestartableApi:
    """The API on a fixed port; each start is a new app, as a restarted process is."""

    def __init__(self, runtime_dsn: str) -> None:
        self.runtime_dsn = runtime_dsn
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self._app = None
        self._server = None

    def start(self) -> None:
        self._app = create_app(api_settings(self.runtime_dsn))
        self._server, _ = serve_in_thread(self._app, "127.0.0.1", self.port)

    def stop(self) -> None:
        assert self._server is not None and self._app is not None
        self._server.shutdown()
        self._server.server_close()
        self._app.extensions[EXTENSION_KEY].engine.dispose()
        self._server = self._app = None


class Lines:
    """An agent's output, line by line, waited on without sleeping."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._reader.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, fragment: str, times: int = 1, timeout: float = 30) -> None:
        with self._changed:
            found = self._changed.wait_for(
                lambda: sum(fragment in line for line in self.lines) >= times, timeout
            )
        assert found, f"not {times} lines with {fragment!r}:\n" + "".join(self.lines)

    def count(self, fragment: str) -> int:
        with self._changed:
            return sum(fragment in line for line in self.lines)


@pytest.fixture
def api(database) -> Iterator[RestartableApi]:
    server = RestartableApi(database.runtime_dsn)
    server.start()
    try:
        yield server
    finally:
        if server._server is not None:
            server.stop()


def _environment(**extra: str) -> dict[str, str]:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(extra)
    return env


def _machines(database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ORQUESTADOR, "machines", *args],
        cwd=ROOT,
        env=_environment(MIGRATION_DATABASE_URL=database.owner_dsn, JWT_SECRET=SECRET),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _send(engine: Engine) -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=ORG,
            machine_id="m-1",
            command="poweroff",
            args=[],
            external_key=f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def _status_when_final(engine: Engine, command_id: str, timeout: float = 30) -> str:
    give_up = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM machine_command WHERE id = :id"), {"id": command_id}
            ).scalar_one()
        if status in ("succeeded", "failed", "timed_out"):
            return status
        assert time.monotonic() < give_up, f"command still {status}"
        time.sleep(0.05)  # polling the database for the agent's report


def test_an_enrolled_agent_survives_api_restarts_and_stops_once_revoked(
    database, api: RestartableApi, runtime_engine: Engine, tmp_path: Path
) -> None:
    enrolled = _machines(database, "enroll", "m-1", "--org", ORG)
    assert enrolled.returncode == 0, enrolled.stderr
    commands = tmp_path / "agent-commands.toml"
    commands.write_text(COMMANDS)
    process = subprocess.Popen(
        [*ORQUESTADOR, "agent", "--wait", "1"],
        cwd=ROOT,
        env=_environment(
            ORQUESTADOR_API_URL=api.url,
            ORQUESTADOR_TOKEN=enrolled.stdout.strip(),
            AGENT_COMMANDS_FILE=str(commands),
            LOG_LEVEL="INFO",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Lines(process)
    try:
        output.wait_for("agent started")
        assert _status_when_final(runtime_engine, _send(runtime_engine)) == "succeeded"

        for restart in range(2):
            api.stop()
            output.wait_for("API unreachable", times=restart + 1)
            waiting = _send(runtime_engine)
            api.start()  # a new app: nothing of the credential is kept in a process
            assert _status_when_final(runtime_engine, waiting) == "succeeded", restart
            assert output.count("API reachable again") == restart + 1
        assert process.poll() is None

        revoked = _machines(database, "revoke", "m-1", "--org", ORG)
        assert revoked.returncode == 0, revoked.stderr

        assert process.wait(30) == 1
        after = _send(runtime_engine)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
    output.wait_for("the API answered 401 to the agent's token")
    output.wait_for("a new token: orquestador machines enroll M --org O")
    with runtime_engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": after}
        ).scalar_one()
    assert status == "pending"
