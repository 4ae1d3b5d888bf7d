"""`orquestador agent` as a real process against a real API, running real commands."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
from api_support import ORG, api_settings
from sqlalchemy import Engine, text

from orquestador.api.agent_routes import POLL_SHARE_EXTENSION, PollShare
from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.tokens import mint_token
from orquestador.machines import cancel_for_execution, create_command
from orquestador.machines.commands import stored_output
from orquestador.serve import serve_in_thread
from tests.integration.worker_support import wait_until

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]

COMMANDS = """\
[poweroff]
argv = ["true"]
timeout_seconds = 10

[reboot]
argv = ["sh", "-c", "echo rebooting; exit 3"]
timeout_seconds = 10

[reinstall]
argv = ["sleep", "30"]
timeout_seconds = 0.5

[chatty]
argv = ["sh", "-c", "printf 'a\\\\000b'; head -c 200000 /dev/zero | tr '\\\\000' x"]
timeout_seconds = 10

[long]
argv = ["sleep", "60"]
timeout_seconds = 120

[stubborn]
argv = ["sh", "-c", "trap '' TERM; sleep 60"]
timeout_seconds = 120

[talking]
argv = ["sh", "-c", "echo started; echo token=$AGENT_SEEN_SECRET; sleep 60"]
timeout_seconds = 120
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiServer:
    """The real app on a fixed port, which a test can stop and start again.

    `answers` counts what it answered, by (path, status).
    """

    def __init__(self, runtime_dsn: str, **overrides: Any) -> None:
        self.settings = api_settings(runtime_dsn, **overrides)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self._app = create_app(self.settings)
        self.answers: Counter[tuple[str, int]] = Counter()
        serve = self._app.wsgi_app

        def counting(environ: dict[str, Any], start_response: Any) -> Any:
            path = environ.get("PATH_INFO", "")

            def respond(status: str, headers: Any, *exc_info: Any) -> Any:
                self.answers[(path, int(status.split()[0]))] += 1
                return start_response(status, headers, *exc_info)

            return serve(environ, respond)

        self._app.wsgi_app = counting  # type: ignore[method-assign]
        self._server = None

    @property
    def app(self) -> Any:
        return self._app

    @property
    def poll_share(self) -> PollShare:
        return self._app.extensions[POLL_SHARE_EXTENSION]

    def start(self) -> None:
        self._server, _ = serve_in_thread(self._app, "127.0.0.1", self.port)

    def stop(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    def dispose(self) -> None:
        if self._server is not None:
            self.stop()
        self._app.extensions[EXTENSION_KEY].engine.dispose()


@pytest.fixture
def api(database) -> Iterator[ApiServer]:
    server = ApiServer(database.runtime_dsn)
    server.start()
    try:
        yield server
    finally:
        server.dispose()


@dataclass
class AgentProcess:
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_for_line(self, fragment: str, timeout: float = 20) -> None:
        with self.changed:
            found = self.changed.wait_for(
                lambda: any(fragment in line for line in self.lines), timeout
            )
        assert found, f"no line with {fragment!r}:\n" + "".join(self.lines)


@contextmanager
def running_agent(
    api: ApiServer,
    commands_file: Path,
    machine: str = "m-1",
    wait: str = "1",
    org: str = ORG,
    **settings: str,
) -> Iterator[AgentProcess]:
    token = mint_token(api.settings, sub=f"machine:{machine}", org=org, scopes=["agent"])
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        ORQUESTADOR_API_URL=api.url,
        ORQUESTADOR_TOKEN=token,
        AGENT_COMMANDS_FILE=str(commands_file),
        LOG_LEVEL="INFO",
        **settings,
    )
    process = subprocess.Popen(
        [*ORQUESTADOR, "agent", "--wait", wait],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    agent = AgentProcess(process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with agent.changed:
                agent.lines.append(line)
                agent.changed.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        agent.wait_for_line("agent started")
        yield agent
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        reader.join(5)


@pytest.fixture
def commands_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent-commands.toml"
    path.write_text(COMMANDS)
    return path


def send(engine: Engine, name: str, machine: str = "m-1", key: str | None = None) -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=ORG,
            machine_id=machine,
            command=name,
            args=[],
            external_key=key or f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def final_row(engine: Engine, command_id: str, timeout: float = 20) -> tuple:
    """The command's (status, exit_code, output as kept) once final; polls the database."""
    give_up = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT status, exit_code, output, output_tail, output_received,"
                    " output_size FROM machine_command WHERE id = :id"
                ),
                {"id": command_id},
            ).one()
        if row.status in ("succeeded", "failed", "timed_out", "cancelled", "expired"):
            return (row.status, row.exit_code, stored_output(row).text)
        assert time.monotonic() < give_up, f"command still {row.status}"
        time.sleep(0.05)


def test_the_agent_runs_commands_and_reports_each_outcome(
    api: ApiServer, commands_file: Path, runtime_engine: Engine
) -> None:
    with running_agent(api, commands_file) as agent:
        ok = send(runtime_engine, "poweroff")
        failing = send(runtime_engine, "reboot")
        slow = send(runtime_engine, "reinstall")
        unknown = send(runtime_engine, "halt")  # not in the commands file
        foreign = send(runtime_engine, "poweroff", machine="m-2")
        chatty = send(runtime_engine, "chatty")

        assert final_row(runtime_engine, ok)[:2] == ("succeeded", 0)
        assert final_row(runtime_engine, failing) == ("failed", 3, "rebooting\n")
        assert final_row(runtime_engine, slow)[:2] == ("timed_out", None)
        status, code, output = final_row(runtime_engine, unknown)
        assert (status, code) == ("failed", None) and "unknown command 'halt'" in output
        # Binary output does not lose the report; a long output keeps its head and its
        # end, and says how much lay between.
        status, code, output = final_row(runtime_engine, chatty)
        assert (status, code) == ("succeeded", 0)
        assert output.startswith("a\ufffdbxxx") and output.endswith("xxx")
        assert "bytes of output dropped" in output
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(15) == 0
    said = "".join(agent.lines)
    assert "agent stopped" in said
    # One line per delivered report, after it was delivered.
    assert f"reported running for command {ok}" in said
    assert f"reported succeeded for command {ok}" in said
    assert f"reported failed for command {unknown}" in said
    assert f"reported timed_out for command {slow}" in said
    with runtime_engine.connect() as conn:
        untouched = conn.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": foreign}
        ).scalar_one()
    assert untouched == "pending"  # another machine's command is not this agent's


def test_the_agent_survives_an_api_restart(
    api: ApiServer, commands_file: Path, runtime_engine: Engine
) -> None:
    with running_agent(api, commands_file) as agent:
        api.stop()
        agent.wait_for_line("API unreachable")
        command_id = send(runtime_engine, "poweroff")
        api.start()
        agent.wait_for_line("API reachable again")

        assert final_row(runtime_engine, command_id)[:2] == ("succeeded", 0)
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(15) == 0
    # One line for the outage, however many tries it took.
    assert sum("API unreachable" in line for line in agent.lines) == 1


def running_status(engine: Engine, command_id: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status = 'running' FROM machine_command WHERE id = :id"),
            {"id": command_id},
        ).scalar_one()


def cancel_its_execution(engine: Engine, execution_id: uuid.UUID) -> list[str]:
    """What the cancel of the command's execution does to it; the ids asked to stop."""
    with engine.begin() as conn:
        done = cancel_for_execution(conn, org_id=ORG, execution_id=execution_id)
    return [str(c.id) for c in done.stop_requested]


def test_a_cancel_stops_the_running_command_with_sigterm_then_sigkill_after_the_grace(
    api: ApiServer, commands_file: Path, runtime_engine: Engine
) -> None:
    with running_agent(api, commands_file, AGENT_KILL_GRACE_SECONDS="1") as agent:
        execution_id = uuid.uuid4()
        long = send(runtime_engine, "long", key=f"{execution_id}:long")
        wait_until(lambda: running_status(runtime_engine, long), what="long to run")
        began = time.monotonic()
        assert cancel_its_execution(runtime_engine, execution_id) == [long]

        # SIGTERM ends sleep: the signal's exit code, well before its 60 s.
        assert final_row(runtime_engine, long)[:2] == ("cancelled", -signal.SIGTERM)
        assert time.monotonic() - began < 15

        execution_id = uuid.uuid4()
        stubborn = send(runtime_engine, "stubborn", key=f"{execution_id}:stubborn")
        wait_until(lambda: running_status(runtime_engine, stubborn), what="stubborn to run")
        assert cancel_its_execution(runtime_engine, execution_id) == [stubborn]

        # It ignores SIGTERM: killed once the grace has passed.
        assert final_row(runtime_engine, stubborn)[:2] == ("cancelled", -signal.SIGKILL)
        agent.wait_for_line(f"reported cancelled for command {stubborn}")
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(15) == 0
    said = "".join(agent.lines)
    assert "the command ignored SIGTERM for 1s: killed" in said
    assert said.count("ignored SIGTERM") == 1


def test_a_running_command_s_output_is_read_through_the_api_while_it_runs(
    api: ApiServer, commands_file: Path, runtime_engine: Engine, monkeypatch
) -> None:
    # A secret the API process knows (a name with SECRET in it): never kept.
    monkeypatch.setenv("AGENT_SEEN_SECRET", "do-not-keep-this-value")
    reader = mint_token(api.settings, sub="ana", org=ORG, scopes=["machines:admin"])
    with running_agent(api, commands_file, AGENT_SEEN_SECRET="do-not-keep-this-value") as agent:
        execution_id = uuid.uuid4()
        talking = send(runtime_engine, "talking", key=f"{execution_id}:talking")
        url = f"{api.url}/machines/m-1/commands/{talking}/output?after=0"

        def said_so_far() -> dict[str, Any] | None:
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {reader}"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                body = json.loads(answer.read())
            return body if "started" in body["output"] else None

        body = wait_until(said_so_far, what="the output while the command runs")
        assert body["complete"] is False and body["truncated"] is False
        assert body["output"] == "started\ntoken=[redacted]\n"
        assert body["nextOffset"] == len(body["output"].encode())
        assert running_status(runtime_engine, talking)
        assert cancel_its_execution(runtime_engine, execution_id) == [talking]
        assert final_row(runtime_engine, talking)[0] == "cancelled"
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(15) == 0


NEXT = "/api/v1/agent/commands/next"


def test_the_agent_waits_as_told_while_the_api_holds_all_its_long_polls(
    database, commands_file: Path, runtime_engine: Engine
) -> None:
    api = ApiServer(database.runtime_dsn, api_threads=2, agent_poll_share=0.5)
    api.start()
    holder: list[int] = []
    try:
        assert api.poll_share.limit == 1
        # Another machine's poll holds the one place.
        token = mint_token(api.settings, sub="machine:m-9", org=ORG, scopes=["agent"])
        hold = urllib.request.Request(
            f"{api.url}/agent/commands/next?wait=30",
            data=b"",
            method="POST",
            headers={"Authorization": f"Bearer {token}"},
        )
        holding = threading.Thread(
            target=lambda: holder.append(urllib.request.urlopen(hold, timeout=40).status)
        )
        holding.start()
        assert api.poll_share.wait_until_held(1, timeout=10)

        with running_agent(api, commands_file) as agent:
            agent.wait_for_line("the API holds all the long polls it allows")
            send(runtime_engine, "poweroff", machine="m-9")
            holding.join(10)
            command_id = send(runtime_engine, "poweroff")

            # Told "Retry-After: 5", the agent polls again after 5 to 7.5 s and gets it.
            assert final_row(runtime_engine, command_id)[:2] == ("succeeded", 0)
            agent.wait_for_line("long poll taken after")
            agent.process.send_signal(signal.SIGTERM)
            assert agent.process.wait(15) == 0
    finally:
        api.dispose()

    assert holder == [200]
    assert api.answers[(NEXT, 429)] <= 2, api.answers
    lines = "".join(agent.lines)
    assert lines.count("the API holds all the long polls it allows") == 1, lines
    assert "API unreachable" not in lines


def test_two_agents_with_one_machines_token_back_off_rather_than_end_each_other_in_a_storm(
    api: ApiServer, commands_file: Path, runtime_engine: Engine
) -> None:
    # Each poll of one agent ends the other's open poll with 204 at once; polling again
    # at once would make that a loop as fast as the API answers.
    with running_agent(api, commands_file, wait="20") as first:
        assert api.poll_share.wait_until_held(1, timeout=10)
        with running_agent(api, commands_file, wait="20") as second:
            first.wait_for_line("ended this agent's long poll early")
            command_id = send(runtime_engine, "poweroff")
            assert final_row(runtime_engine, command_id)[:2] == ("succeeded", 0)
            for agent in (first, second):
                agent.process.send_signal(signal.SIGTERM)
                assert agent.process.wait(15) == 0

    polls = sum(count for (path, _), count in api.answers.items() if path == NEXT)
    assert polls < 60, api.answers
    assert "API unreachable" not in "".join(first.lines + second.lines)


def test_sigterm_while_waiting_on_a_long_poll_stops_at_once(
    api: ApiServer, commands_file: Path
) -> None:
    with running_agent(api, commands_file) as agent:
        started = time.monotonic()
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(15) == 0
    assert time.monotonic() - started < 5


def test_a_bad_commands_file_is_refused_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'poweroff = "shutdown -h now"\n'
        "[reboot]\nargv = []\ntimeout_seconds = 0\n"
        '[reinstall]\nargv = ["no-such-program-here"]\ntimeout_seconds = 5\nshell = true\n'
    )
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}

    checked = subprocess.run(
        [*ORQUESTADOR, "agent", "--check"],
        env={**env, "AGENT_COMMANDS_FILE": str(bad)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert checked.returncode == 2
    lines = checked.stderr.strip().splitlines()
    assert len(lines) == 5, lines
    assert all(line.startswith(f"orquestador: AGENT_COMMANDS_FILE {bad}: [") for line in lines)
    joined = "\n".join(lines)
    assert "[poweroff] must be a table" in joined
    assert "[reboot]: argv must be a non-empty list" in joined
    assert "[reboot]: timeout_seconds must be a number above 0" in joined
    assert "[reinstall]: unknown key 'shell'" in joined
    assert "'no-such-program-here' is not an executable" in joined


def test_token_for_a_machine_has_the_agent_scope_and_names_the_machine() -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env["JWT_SECRET"] = "machine-token-test-secret-" + "0" * 32

    minted = subprocess.run(
        [*ORQUESTADOR, "token", "--machine", "m-1", "--org", "acme"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    both = subprocess.run(
        [*ORQUESTADOR, "token", "--machine", "m-1", "--org", "acme", "--scope", "flows:admin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert minted.returncode == 0, minted.stderr
    claims = jwt.decode(
        minted.stdout.strip(), env["JWT_SECRET"], algorithms=["HS256"], audience="orquestador-api"
    )
    assert (claims["sub"], claims["org"], claims["scope"]) == ("machine:m-1", "acme", "agent")
    assert both.returncode == 2 and "drop --scope" in both.stderr


def test_the_agent_without_its_settings_names_each_missing_one() -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}

    started = subprocess.run(
        [*ORQUESTADOR, "agent"], env=env, capture_output=True, text=True, timeout=60
    )

    assert started.returncode == 2
    lines = started.stderr.strip().splitlines()
    assert [line.split()[1] for line in lines] == [
        "AGENT_COMMANDS_FILE",
        "ORQUESTADOR_API_URL",
        "ORQUESTADOR_TOKEN",
    ]
