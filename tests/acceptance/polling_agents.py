"""Long-polling agents by the hundred against `orquestador api` under gunicorn, and latency
probes beside them: for the poll-capacity tests and benchmarks/agent_polls.py.

The agents are raw sockets on one selector thread, so the caller's own client is never
the bottleneck; they behave as the reference agent does (poll again at once after an
answer, after Retry-After with jitter after a 429).
"""

from __future__ import annotations

import json
import math
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 200
# Shorter than the reference agent's wait: the taken polls cycle faster (a harder load),
# and every agent has had its first answer within one wait, before measuring starts.
POLL_WAIT_SECONDS = 5
# A probe not answered by then counts as that slow; before the fix they waited minutes.
PROBE_TIMEOUT_SECONDS = 2.0
SECRET = "agent-poll-capacity-secret-0123456789abcdef"
ORG = "acme"
FLOW = {
    "key": "capacity",
    "trigger": "manual",
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "finish", "from": ["new"], "actions": [], "to": "done"}],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningApi:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1{path}"


@contextmanager
def gunicorn_api(
    database_url: str,
    log: Path,
    command: list[str] | None = None,
    **environment: str,
) -> Iterator[RunningApi]:
    """`orquestador api` (or COMMAND) with nothing but what a deployment must set: the
    shipped workers, threads, share and gunicorn settings."""
    port = free_port()
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DATABASE_URL=database_url,
        API_PORT=str(port),
        REQUEST_API_ENABLED="true",
        FLOW_ADMIN_ENABLED="true",
        JWT_SECRET=SECRET,
        **environment,
    )
    with log.open("wb") as sink:
        # A file, not a pipe: nobody has to read the access log for gunicorn to go on.
        process = subprocess.Popen(
            command or [sys.executable, "-m", "orquestador.cli", "api"],
            env=env,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    api = RunningApi(port, process, log)
    try:
        deadline = time.monotonic() + 60
        while _status(api.url("/readyz")) != 200:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the API did not become ready"
            time.sleep(0.1)
        yield api
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def call(url: str, token: str, body: object | None = None) -> dict:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


# --- the agents ---------------------------------------------------------------------------


@dataclass
class _Agent:
    request: bytes
    sock: socket.socket | None = None
    registered: bool = False
    received: bytearray = field(default_factory=bytearray)
    due: float = 0.0


class PollingAgents:
    """AGENTS long pollers on one thread: each polls, reads the answer, and polls again."""

    def __init__(self, port: int, tokens: list[str]) -> None:
        self._port = port
        self._agents = [
            _Agent(
                (
                    f"POST /api/v1/agent/commands/next?wait={POLL_WAIT_SECONDS} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Length: 0\r\nConnection: close\r\n\r\n"
                ).encode()
            )
            for token in tokens
        ]
        self.answers: Counter[str] = Counter()
        self.everyone_answered = threading.Event()
        self._answered: set[int] = set()
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name="polling-agents", daemon=True)

    def __enter__(self) -> PollingAgents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for agent in self._agents:
            if agent.sock is not None:
                agent.sock.close()
        self._selector.close()

    def _poll(self, index: int) -> None:
        agent = self._agents[index]
        agent.received.clear()
        try:
            agent.sock = socket.create_connection(("127.0.0.1", self._port), timeout=5)
            agent.sock.sendall(agent.request)
            agent.sock.setblocking(False)
            self._selector.register(agent.sock, selectors.EVENT_READ, index)
            agent.registered = True
        except OSError:
            self._answer(index, "connection refused", retry_after=1.0)

    def _answer(self, index: int, outcome: str, retry_after: float = 0.0) -> None:
        agent = self._agents[index]
        if agent.registered:
            self._selector.unregister(agent.sock)
            agent.registered = False
        if agent.sock is not None:
            agent.sock.close()
            agent.sock = None
        self.answers[outcome] += 1
        # As the reference agent: at once after an answer, Retry-After * [1, 1.5) after 429.
        agent.due = time.monotonic() + retry_after * random.uniform(1.0, 1.5)
        self._answered.add(index)
        if len(self._answered) == len(self._agents):
            self.everyone_answered.set()

    def _read(self, index: int) -> None:
        agent = self._agents[index]
        assert agent.sock is not None
        try:
            chunk = agent.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            agent.received += chunk
            return
        head = bytes(agent.received).split(b"\r\n\r\n", 1)[0].decode("latin-1")
        lines = head.split("\r\n")
        status = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "no answer"
        retry_after = 0.0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "retry-after":
                retry_after = float(value.strip())
        self._answer(index, status, retry_after if status == "429" else 0.0)

    def _run(self) -> None:
        for index in range(len(self._agents)):
            self._poll(index)
        while not self._stop.is_set():
            now = time.monotonic()
            for index, agent in enumerate(self._agents):
                if agent.sock is None and agent.due <= now:
                    self._poll(index)
            waiting = [a.due for a in self._agents if a.sock is None]
            timeout = max(0.0, min(waiting) - time.monotonic()) if waiting else 0.5
            for key, _ in self._selector.select(min(timeout, 0.5)):
                self._read(key.data)


# --- latency probes -----------------------------------------------------------------------


def latency(
    port: int, path: str, token: str | None, timeout: float = PROBE_TIMEOUT_SECONDS
) -> float:
    """Seconds until the whole answer of one GET on a fresh connection arrived (200 only);
    an answer not complete within TIMEOUT counts as TIMEOUT."""
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall((head + "\r\n").encode())
            answer = bytearray()
            while chunk := s.recv(65536):
                answer += chunk
                if time.perf_counter() - started > timeout:
                    break
    except OSError:  # a timeout: counted as the bound
        return timeout
    assert answer.startswith(b"HTTP/1.1 200"), bytes(answer[:200])
    return min(time.perf_counter() - started, timeout)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return f"{name}: no samples"

    def at(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

    every = ", ".join(f"{v * 1000:.1f}" for v in values)
    return (
        f"{name}: {len(values)} samples, p50 {at(0.5):.1f} ms, p90 {at(0.9):.1f} ms, "
        f"p99 {at(0.99):.1f} ms, max {ordered[-1] * 1000:.1f} ms\n  all (ms, in order): {every}"
    )
