"""The reference agent's commands: the file's checks and how one command runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orquestador import agent as agent_module
from orquestador.agent import (
    CHUNK_BYTES,
    Agent,
    CommandSpec,
    OutputStream,
    load_commands,
    run_command,
)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended; only its parent's record remains


def test_a_timeout_kills_the_command_and_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    spec = CommandSpec("slow", ("sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"), 0.5)

    started = time.monotonic()
    outcome = run_command(spec, [])

    assert outcome.status == "timed_out" and outcome.exit_code is None
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    # SIGKILL is delivered asynchronously: give the kernel a moment to end the child.
    give_up = time.monotonic() + 5
    while _alive(child) and time.monotonic() < give_up:
        time.sleep(0.01)
    assert not _alive(child)


def test_server_args_are_ignored_unless_the_operator_passes_them() -> None:
    ignored = CommandSpec("say", ("echo", "fixed"), 5)
    passed = CommandSpec("say", ("echo", "fixed"), 5, pass_args=True)

    assert run_command(ignored, ["; rm -rf /"]).output == "fixed\n"
    # Each arg is one argv item, never parsed by a shell.
    assert run_command(passed, ["$(id)", "; true"]).output == "fixed $(id) ; true\n"


def test_a_program_that_cannot_start_is_a_failure(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.write_text("#!/bin/sh\n")  # not executable

    outcome = run_command(CommandSpec("x", (str(gone),), 5), [])

    assert (outcome.status, outcome.exit_code) == ("failed", None)
    assert "cannot start" in outcome.output


def test_a_valid_file_loads_every_command(tmp_path: Path) -> None:
    path = tmp_path / "commands.toml"
    path.write_text(
        '[poweroff]\nargv = ["true"]\ntimeout_seconds = 5\n'
        '[reinstall]\nargv = ["echo"]\ntimeout_seconds = 0.5\npass_args = true\n'
    )

    commands, problems = load_commands(path)

    assert problems == []
    assert commands == {
        "poweroff": CommandSpec("poweroff", ("true",), 5.0),
        "reinstall": CommandSpec("reinstall", ("echo",), 0.5, pass_args=True),
    }


def test_an_unreadable_or_invalid_file_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[poweroff\n")

    assert len(load_commands(tmp_path / "missing.toml")[1]) == 1
    assert "not valid TOML" in load_commands(broken)[1][0]
    assert "no commands" in load_commands(_empty(tmp_path))[1][0]


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.toml"
    path.write_text("")
    return path


class _RecordingClient:
    """The agent's two routes, answered from a script; every report is kept."""

    def __init__(self, cancel_requested: bool) -> None:
        self.reports: list[tuple[str, str]] = []
        self._cancel_requested = cancel_requested

    def report(self, command_id: str, status: str, outcome: object = None) -> tuple[int, dict]:
        self.reports.append((command_id, status))
        return 200, {"status": status, "cancelRequested": self._cancel_requested}


def test_a_stop_request_from_a_poll_is_reported_cancelled_and_runs_nothing(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    spec = CommandSpec("poweroff", ("touch", str(marker)), 5)
    client = _RecordingClient(cancel_requested=True)
    agent = Agent(client, {"poweroff": spec})  # type: ignore[arg-type]

    agent._handle({"id": "c-1", "cancelRequested": True})
    # Told at its report of running, before it started: it is not started.
    agent._handle({"id": "c-2", "command": "poweroff", "args": []})

    assert client.reports == [("c-1", "cancelled"), ("c-2", "running"), ("c-2", "cancelled")]
    assert not marker.exists()


def test_a_command_ends_cancelled_once_a_check_says_so(tmp_path: Path) -> None:
    spec = CommandSpec("long", ("sleep", "30"), 60)
    checks: list[float] = []

    def told_at_the_second_check(stream: OutputStream) -> bool:
        checks.append(time.monotonic())
        return len(checks) == 2

    began = time.monotonic()
    outcome = run_command(
        spec, [], should_stop=told_at_the_second_check, check_seconds=0.1, kill_grace_seconds=5
    )

    assert (outcome.status, outcome.exit_code) == ("cancelled", -15)
    assert time.monotonic() - began < 5


def test_a_command_past_its_deliver_by_time_is_reported_expired_and_never_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    spec = CommandSpec("reboot", ("touch", str(marker)), 5)
    client = _RecordingClient(cancel_requested=False)
    agent = Agent(client, {"reboot": spec})  # type: ignore[arg-type]

    # The server handed it out with no time left (the answer crossed its deliver-by time).
    agent._handle(
        {
            "id": "c-1",
            "command": "reboot",
            "args": [],
            "deliverBy": "2026-03-01T09:30:00+00:00",
            "deliverWithinSeconds": 0,
        }
    )

    assert client.reports == [("c-1", "expired")]
    assert not marker.exists()


class _SlowToReportRunning(_RecordingClient):
    """Its report of running takes longer than the command had left (an API outage): it
    moves the agent's clock on by `delay` seconds."""

    def __init__(self, clock: list[float], delay: float) -> None:
        super().__init__(cancel_requested=False)
        self._clock = clock
        self._delay = delay

    def report(self, command_id: str, status: str, outcome: object = None) -> tuple[int, dict]:
        if status == "running":
            self._clock[0] += self._delay
        return super().report(command_id, status, outcome)


def test_a_command_whose_time_runs_out_while_reporting_running_is_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(agent_module.time, "monotonic", lambda: clock[0])
    marker = tmp_path / "ran"
    spec = CommandSpec("reboot", ("touch", str(marker)), 5)
    client = _SlowToReportRunning(clock, delay=30)
    agent = Agent(client, {"reboot": spec})  # type: ignore[arg-type]

    agent._handle({"id": "c-1", "command": "reboot", "args": [], "deliverWithinSeconds": 20})

    assert client.reports == [("c-1", "running"), ("c-1", "expired")]
    assert not marker.exists()


def test_a_command_with_time_left_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = CommandSpec("reboot", ("touch", str(marker)), 5)
    client = _RecordingClient(cancel_requested=False)
    agent = Agent(client, {"reboot": spec})  # type: ignore[arg-type]

    agent._handle({"id": "c-1", "command": "reboot", "args": [], "deliverWithinSeconds": 600})

    assert client.reports == [("c-1", "running"), ("c-1", "succeeded")]
    assert marker.exists()


def _file(tmp_path: Path, content: bytes) -> int:
    path = tmp_path / "output"
    path.write_bytes(content)
    return os.open(path, os.O_RDONLY)


def test_output_goes_in_chunks_of_whole_lines_each_sent_until_taken(tmp_path: Path) -> None:
    stream = OutputStream(_file(tmp_path, "one\ntwo\nthr€".encode()))

    first = stream.chunk(final=False)
    again = stream.chunk(final=False)  # not taken yet (the answer was lost): the same
    assert first == again and first is not None
    assert (first.offset, first.text) == (0, "one\ntwo\n")
    stream.taken(first)
    assert stream.chunk(final=False) is not None  # the rest of a line, once it is whole
    last = stream.chunk(final=True)
    assert last is not None and (last.offset, last.text) == (8, "thr€")
    stream.taken(last)
    assert stream.offset == len("one\ntwo\nthr€".encode())
    assert stream.chunk(final=True) is None


def test_a_backlog_too_long_for_one_chunk_at_the_end_sends_its_last_chunk(
    tmp_path: Path,
) -> None:
    content = b"x" * (3 * CHUNK_BYTES) + b"the end\n"
    stream = OutputStream(_file(tmp_path, content))

    last = stream.chunk(final=True)

    assert last is not None and last.text.endswith("the end\n")
    assert len(last.text) == CHUNK_BYTES
    assert last.offset == len(content) - CHUNK_BYTES  # the skipped bytes: dropped


def test_a_partial_character_waits_for_the_rest_of_it(tmp_path: Path) -> None:
    stream = OutputStream(_file(tmp_path, "año".encode()[:2]))  # "a" and half of "ñ"

    chunk = stream.chunk(final=False)

    assert chunk is not None and chunk.text == "a"


def test_a_running_command_s_output_is_reported_while_it_runs(tmp_path: Path) -> None:
    go = tmp_path / "go"
    # It says "second" only once its first line was reported: no timing in this test.
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.01; done; echo second"
    spec = CommandSpec("talk", ("sh", "-c", script), 30)
    seen: list[str] = []

    def collect(stream: OutputStream) -> bool:
        chunk = stream.chunk(final=False)
        if chunk is not None:
            seen.append(chunk.text)
            stream.taken(chunk)
            go.touch()
        return False

    outcome = run_command(spec, [], should_stop=collect, check_seconds=0.05)

    assert seen[0] == "first\n"  # before the command ended
    assert "".join(seen) + outcome.output == "first\nsecond\n"
    assert outcome.output_offset == len("".join(seen).encode())
