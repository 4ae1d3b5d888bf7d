"""Operations with real processes: metrics of both, JSON logs without secrets, one leader.

`orquestador api` (gunicorn, two workers: multiprocess metrics) and `orquestador worker`
run on the test database with LOG_FORMAT=json; a flow calls an HTTP route whose header
carries a secret, with a secret in the request data, and the caller adds a token to the
query string. Then both metrics endpoints are scraped and every captured log line is
read back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest

from tests.db_support import TestDatabase

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
JWT_SECRET = "operations-test-signing-key-0123456789"
ROUTE_SECRET = "route-secret-7f3a9c21e8"
INPUT_SECRET = "input-secret-4242424242"
QUERY_SECRET = "query-secret-b0b0b0b0"

INTEGRATIONS = """
[[route]]
capability = "test.echo"
version = 1
effect = "READ_ONLY"
method = "POST"
url = "${ECHO_URL}/echo"
headers = { X-Api-Key = "${ECHO_SECRET}" }
timeout_seconds = 5
max_attempts = 5
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Echo(BaseHTTPRequestHandler):
    """Answers 503 twice (two retries), then 200; keeps the key header it was sent."""

    calls: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Echo.calls.append(self.headers.get("X-Api-Key", ""))
        status, body = (503, b"{}") if len(_Echo.calls) <= 2 else (200, b'{"ok": true}')
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    _Echo.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class _Output:
    """A process's combined output, read by a thread so the pipe never fills."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def join(self) -> str:
        self._thread.join(10)
        return "\n".join(self.lines)


def _env(database: TestDatabase, **values: str) -> dict[str, str]:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(DATABASE_URL=database.runtime_dsn, LOG_FORMAT="json", **values)
    return env


def _start(
    processes: list[subprocess.Popen[str]], command: str, env: dict[str, str]
) -> tuple[subprocess.Popen[str], _Output]:
    process = subprocess.Popen(
        [*ORQUESTADOR, command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    return process, _Output(process.stdout)


def _call(
    url: str, body: Any = None, token: str | None = None, method: str | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def _wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _samples(text: str, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric in Prometheus text (labels as written, '' if none)."""
    found = {}
    for match in re.finditer(rf"^{name}(?:\{{(.*?)\}})? (\S+)$", text, re.MULTILINE):
        found[match.group(1) or ""] = float(match.group(2))
    return found


def _token(subject: str = "alice") -> str:
    from orquestador.api.tokens import mint_token
    from orquestador.config import Settings

    settings = Settings.from_env({}, jwt_secret=JWT_SECRET)
    return mint_token(
        settings,
        sub=subject,
        org="acme",
        scopes=["flows:admin", "requests:read", "requests:write"],
        ttl_seconds=600,
    )


def test_metrics_and_json_logs_of_a_run_that_used_secrets(
    database: TestDatabase,
    processes: list[subprocess.Popen[str]],
    echo_url: str,
    tmp_path: Path,
) -> None:
    integrations = tmp_path / "integrations.toml"
    integrations.write_text(INTEGRATIONS)
    shared = {
        "INTEGRATIONS_FILE": str(integrations),
        "ECHO_URL": echo_url,
        "ECHO_SECRET": ROUTE_SECRET,
        "JWT_SECRET": JWT_SECRET,
    }
    api_port, metrics_port = _free_port(), _free_port()
    api, api_output = _start(
        processes,
        "api",
        _env(
            database,
            API_PORT=str(api_port),
            API_WORKERS="2",
            REQUEST_API_ENABLED="true",
            FLOW_ADMIN_ENABLED="true",
            PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "api-metrics"),
            **shared,
        ),
    )
    worker, worker_output = _start(
        processes,
        "worker",
        _env(
            database,
            WORKER_ENABLED="true",
            WORKER_METRICS_PORT=str(metrics_port),
            WORKER_POLL_MS="100",
            RETRY_BASE_SECONDS="0.1",
            RETRY_CAP_SECONDS="0.3",
            RETRY_AFTER_MIN_SECONDS="0.1",
            MAINTENANCE_INTERVAL_SECONDS="1",
            **shared,
        ),
    )
    base = f"http://127.0.0.1:{api_port}"
    _wait_for(lambda: _call(f"{base}/readyz")[0] == 200, 60, "the API")
    token = _token()

    definition = {
        "key": "echo-secret",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "to": "done",
                "actions": [
                    {
                        "id": "echo",
                        "capability": "test.echo",
                        "version": 1,
                        "input": {"card": {"from": "/data/card"}},
                    }
                ],
            }
        ],
    }
    status, flow = _call(f"{base}/api/v1/flows", definition, token)
    assert status == 201, flow
    status, created = _call(
        f"{base}/api/v1/requests", {"flowId": flow["id"], "data": {"card": INPUT_SECRET}}, token
    )
    assert status == 201, created
    status, accepted = _call(
        f"{base}/api/v1/requests/{created['id']}/transitions?access_token={QUERY_SECRET}",
        {"transition": "go", "expectedRevision": created["revision"]},
        token,
    )
    assert status == 202, accepted
    execution_id = accepted["executionId"]
    _wait_for(
        lambda: (
            _call(f"{base}/api/v1/executions/{execution_id}", token=token)[1].get("status")
            == "SUCCEEDED"
        ),
        60,
        "the execution to succeed",
    )
    assert _Echo.calls == [ROUTE_SECRET] * 3  # the secret header was really sent

    # The API: every gunicorn worker's requests in one scrape, by route template.
    scrapes = [_call(f"{base}/metrics")[1] for _ in range(4)]
    for text in scrapes:
        requests = _samples(text, "orquestador_http_requests_total")
        transitions = 'route="/api/v1/requests/<uuid:request_id>/transitions",status="202"'
        assert requests.get(transitions) == 1.0, requests
        assert not any(execution_id in labels for labels in requests)
        assert not any(created["id"] in labels for labels in requests)
        durations = _samples(text, "orquestador_http_request_duration_seconds_count")
        assert durations.get('route="/api/v1/flows"') == 1.0

    # The worker: claims, retries and the maintenance leader's gauges.
    worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"

    def sampled() -> str | None:
        # The leader samples every second; a pass that ran before the execution ended
        # still counts it, so wait for one that ran after.
        text = _call(worker_metrics)[1]
        leader = _samples(text or "", "orquestador_maintenance_leader")
        depth = _samples(text or "", "orquestador_queue_depth")
        settled = depth.get('status="PENDING"') == 0.0 and depth.get('status="RUNNING"') == 0.0
        return text if leader.get("") == 1.0 and settled else None

    text = _wait_for(sampled, 30, "a maintenance pass after the execution ended")
    assert _samples(text, "orquestador_claim_batch_size_count")[""] >= 3  # first try + 2 retries
    assert _samples(text, "orquestador_queue_depth")['status="PENDING"'] == 0.0
    assert _samples(text, "orquestador_lease_lost_total")[""] == 0.0
    # Two 503 answers: two retries of that capability, then one success.
    assert _samples(text, "orquestador_retries_total") == {'capability="test.echo@1"': 2.0}
    assert _samples(text, "orquestador_executions_total")['status="SUCCEEDED"'] == 1.0
    calls = _samples(text, "orquestador_action_duration_seconds_count")
    assert sum(calls.values()) == 3.0

    for process in (api, worker):
        process.send_signal(signal.SIGTERM)
    for process in (api, worker):
        process.wait(60)
    logs = {"api": api_output.join(), "worker": worker_output.join()}
    assert (api.returncode, worker.returncode) == (0, 0), logs

    records = {}
    for name, output in logs.items():
        for secret in (ROUTE_SECRET, INPUT_SECRET, QUERY_SECRET, token, JWT_SECRET):
            assert secret not in output, f"{name} logged a secret"
        assert "Traceback" not in output
        # Every line is one JSON object (the formatter, not print statements).
        records[name] = [json.loads(line) for line in output.splitlines() if line.strip()]

    access = [r for r in records["api"] if r.get("logger") == "gunicorn.access"]
    transition_line = next(r for r in access if r["path"].endswith("/transitions"))
    assert transition_line["query"] == "access_token=[redacted]"
    assert transition_line["status"] == 202
    # The worker's lines about the failed attempts name what they are about.
    about = [r for r in records["worker"] if r.get("execution_id") == execution_id]
    assert about, "no worker line names the execution"
    assert any(r.get("action_id") == "echo" and r.get("capability") == "test.echo@1" for r in about)


def _leader_lines(output: _Output) -> list[dict[str, Any]]:
    found = []
    for line in list(output.lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("message") == "maintenance leadership taken":
            found.append(record)
    return found


def test_after_kill_9_of_the_leader_another_worker_takes_over_within_one_interval(
    database: TestDatabase, processes: list[subprocess.Popen[str]]
) -> None:
    interval = 2
    workers = {}
    for number in range(3):
        name = f"worker-{number}"
        process, output = _start(
            processes,
            "worker",
            _env(
                database,
                WORKER_ENABLED="true",
                WORKER_ID=name,
                MAINTENANCE_INTERVAL_SECONDS=str(interval),
            ),
        )
        workers[name] = (process, output)

    def leaders() -> list[str]:
        return [r["worker_id"] for _, out in workers.values() for r in _leader_lines(out)]

    (first,) = _wait_for(leaders, 60, "a maintenance leader")
    # Every worker is up and polling the lock: still one leader after two more intervals.
    _wait_for(
        lambda: all(
            any("worker starting" in line for line in out.lines) for _, out in workers.values()
        ),
        60,
        "every worker to start",
    )
    time.sleep(2 * interval)
    assert leaders() == [first]

    workers[first][0].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    (second,) = _wait_for(
        lambda: [name for name in leaders() if name != first], 5 * interval, "a new leader"
    )
    took = time.monotonic() - killed_at
    # At the next polls of the lock, not after a session timeout (minutes); two more
    # intervals are room for a busy machine to schedule the processes.
    assert took <= 3 * interval + 1.5, f"took over after {took:.1f} s"
    assert second != first
    time.sleep(interval)
    assert [name for name in leaders() if name != first] == [second]

    for name, (process, _) in workers.items():
        if name != first:
            process.send_signal(signal.SIGTERM)
    for name, (process, _) in workers.items():
        if name != first:
            assert process.wait(60) == 0
