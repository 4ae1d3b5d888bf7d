"""What a client meets on the wire, through both real HTTP servers: gunicorn (`orquestador
api`) and the development server (`orquestador dev`). Limits answer problems, headers
say nothing about versions and forbid caching and sniffing, a query token is neither
accepted nor logged."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pytest

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from tests.db_support import TestServer, create_database, drop_database
from tests.integration.api_support import REGISTRY

SECRET = "http-hygiene-test-secret-" + "0123456789abcdef" * 2
MAX_BODY_BYTES = 4096
# The limits docs/API.md publishes ("Limits").
MAX_REQUEST_LINE_BYTES = 4094
MAX_HEADER_FIELDS = 100
MAX_HEADER_FIELD_BYTES = 8190
# Names no capability, so gunicorn's process (the built-in registry) publishes it too.
FLOW = {
    "key": "hygiene",
    "trigger": "manual",
    "initialState": "new",
    "states": ["new", "done"],
    "transitions": [{"id": "finish", "from": ["new"], "actions": [], "to": "done"}],
}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def problem(self) -> dict:
        assert self.headers.get("content-type") == "application/problem+json", self
        document = json.loads(self.body)
        assert document["status"] == self.status
        return document


@dataclass
class Served:
    """One real server on loopback, a token it accepts, and a way to read its request log."""

    name: str
    port: int
    token: str
    request_log: Callable[[], str]

    def send(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | Iterable[bytes] | None = None,
        chunked: bool = False,
    ) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(
                method, path, body=body, headers=headers or {}, encode_chunked=chunked
            )
            response = connection.getresponse()
            return Answer(
                response.status,
                {name.lower(): value for name, value in response.getheaders()},
                response.read(),
            )
        finally:
            connection.close()

    def authorized(self, **headers: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **headers}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_healthy(served: Served, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}")
        try:
            if served.send("GET", "/api/v1/healthz").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server did not become healthy")


@pytest.fixture(scope="module")
def module_database(pg_server: TestServer, template_database: str) -> Iterator[str]:
    name = create_database(pg_server, "orquestador_test", template=template_database)
    try:
        yield pg_server.url(name, runtime=True).render_as_string(hide_password=False)
    finally:
        drop_database(pg_server, name)


def _settings(runtime_dsn: str) -> Settings:
    return Settings.from_env(
        {},
        database_url=runtime_dsn,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret=SECRET,
        api_max_body_bytes=MAX_BODY_BYTES,
    )


def _token(settings: Settings) -> str:
    return mint_token(
        settings,
        sub="alice",
        org="org-a",
        scopes=["flows:admin", "requests:read", "requests:write"],
    )


@pytest.fixture(scope="module")
def gunicorn_server(
    module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    port = _free_port()
    log_path = tmp_path_factory.mktemp("gunicorn") / "output.log"
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DATABASE_URL=module_database,
        API_PORT=str(port),
        API_WORKERS="1",
        REQUEST_API_ENABLED="true",
        FLOW_ADMIN_ENABLED="true",
        JWT_SECRET=SECRET,
        API_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
    )
    with log_path.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "orquestador.cli", "api"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    served = Served("gunicorn", port, _token(_settings(module_database)), log_path.read_text)
    try:
        _wait_until_healthy(served, process)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def development_server(module_database: str) -> Iterator[Served]:
    from orquestador.serve import serve_in_thread

    settings = _settings(module_database)
    app = create_app(settings, registry=REGISTRY)
    records = _Records()
    werkzeug_log = logging.getLogger("werkzeug")
    previous_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.INFO)
    werkzeug_log.addHandler(records)
    server, thread = serve_in_thread(app, "127.0.0.1", 0)
    served = Served(
        "development", server.server_port, _token(settings), lambda: "\n".join(records.lines)
    )
    try:
        _wait_until_healthy(served)
        yield served
    finally:
        server.shutdown()
        thread.join(10)
        werkzeug_log.removeHandler(records)
        werkzeug_log.setLevel(previous_level)
        app.extensions[EXTENSION_KEY].engine.dispose()


@pytest.fixture(params=["gunicorn", "development"])
def served(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue(f"{request.param}_server")


def _chunks(total: int) -> Iterator[bytes]:
    yield b'{"flowId": "x", "data": {"pad": "'
    for _ in range(total // 1000):
        yield b"x" * 1000
    yield b'"}}'


def test_an_oversized_chunked_body_is_413_like_an_oversized_content_length(served: Served) -> None:
    chunked = served.send(
        "POST",
        "/api/v1/requests",
        headers=served.authorized(**{"Content-Type": "application/json"}),
        body=_chunks(3 * MAX_BODY_BYTES),
        chunked=True,
    )
    sized = served.send(
        "POST",
        "/api/v1/requests",
        headers=served.authorized(**{"Content-Type": "application/json"}),
        body=b"".join(_chunks(3 * MAX_BODY_BYTES)),
    )

    assert chunked.status == sized.status == 413
    assert chunked.problem() == sized.problem()
    assert chunked.problem()["code"] == "BODY_TOO_LARGE"


def test_a_chunked_body_within_the_limit_is_read_whole(served: Served) -> None:
    body = json.dumps({"flowId": str(uuid.uuid4()), "data": {"pad": "x" * (MAX_BODY_BYTES - 100)}})
    assert len(body) <= MAX_BODY_BYTES

    answer = served.send(
        "POST",
        "/api/v1/requests",
        headers=served.authorized(**{"Content-Type": "application/json"}),
        body=[body[:1000].encode(), body[1000:].encode()],
        chunked=True,
    )

    # Parsed and checked (an unknown flow), not cut short into malformed JSON.
    assert answer.status == 422
    assert answer.problem()["code"] == "FLOW_UNKNOWN"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"X-Padding": "a" * MAX_HEADER_FIELD_BYTES}, id="one-field-over"),
        pytest.param({"X-Padding": "a" * 70_000}, id="one-field-far-over"),
        pytest.param({f"X-Field-{i}": "1" for i in range(MAX_HEADER_FIELDS + 1)}, id="too-many"),
    ],
)
def test_an_oversized_head_is_a_431_problem(served: Served, headers: dict[str, str]) -> None:
    answer = served.send("GET", "/api/v1/healthz", headers=headers)

    assert answer.status == 431
    assert answer.problem()["code"] == "HEADERS_TOO_LARGE"
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_headers_at_the_limits_are_accepted(served: Served) -> None:
    # "X-Padding: " and the CRLF count as gunicorn counts them.
    headers = {"X-Padding": "a" * (MAX_HEADER_FIELD_BYTES - len("X-Padding: \r\n"))}
    headers.update({f"X-Field-{i}": "1" for i in range(MAX_HEADER_FIELDS - 10)})

    assert served.send("GET", "/api/v1/healthz", headers=headers).status == 200


@pytest.mark.parametrize("length", [MAX_REQUEST_LINE_BYTES, 70_000])
def test_an_overlong_request_line_is_a_414_problem(served: Served, length: int) -> None:
    answer = served.send("GET", "/api/v1/healthz?pad=" + "a" * length)

    assert answer.status == 414
    assert answer.problem()["code"] == "URI_TOO_LONG"


@pytest.mark.parametrize(
    "method, path, authorized, status",
    [
        ("POST", "/api/v1/flows", True, 201),
        ("GET", "/api/v1/flows/{missing}", True, 404),
        ("GET", "/api/v1/flows/{missing}", False, 401),
        ("GET", "/api/v1/healthz", False, 200),
        ("GET", "/api/v1/openapi.json", False, 200),
    ],
)
def test_every_answer_forbids_sniffing_and_authenticated_ones_caching(
    served: Served, method: str, path: str, authorized: bool, status: int
) -> None:
    body = json.dumps(FLOW).encode() if method == "POST" else None
    headers = {"Content-Type": "application/json"} if body else {}
    if authorized:
        headers = served.authorized(**headers)

    answer = served.send(method, path.format(missing=uuid.uuid4()), headers=headers, body=body)

    assert answer.status == status, answer.body
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["cache-control"] == "no-store"


def test_the_server_header_names_no_versions(served: Served) -> None:
    answer = served.send("GET", "/api/v1/healthz")

    server = answer.headers.get("server", "")
    assert "/" not in server and "python" not in server.lower(), server


@pytest.mark.parametrize("name", ["access_token", "token", "jwt", "id_token"])
def test_a_query_token_is_refused_and_never_logged(served: Served, name: str) -> None:
    marker = uuid.uuid4()

    answer = served.send("GET", f"/api/v1/requests/{marker}?{name}={served.token}&x=1")

    assert answer.status == 401
    assert answer.problem()["code"] == "UNAUTHENTICATED"
    log = _wait_for(served.request_log, str(marker))
    line = next(line for line in log.splitlines() if str(marker) in line)
    assert f"{name}=[redacted]&x=1" in line
    assert served.token not in log
    assert served.token.split(".")[2] not in log  # not even the signature


def _wait_for(read: Callable[[], str], text: str) -> str:
    # The access line is written once the answer has gone out, in another process.
    deadline = time.monotonic() + 10
    while True:
        content = read()
        if text in content or time.monotonic() > deadline:
            return content
        time.sleep(0.05)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("GET /a?access_token=abc.def&x=1 HTTP/1.1", "GET /a?access_token=[redacted]&x=1 HTTP/1.1"),
        (
            '"GET /a?a=1&JWT=zz;api_key=k#f HTTP/1.1"',
            '"GET /a?a=1&JWT=[redacted];api_key=[redacted]#f HTTP/1.1"',
        ),
        ("GET /a?access%5Ftoken=abc HTTP/1.1", "GET /a?access%5Ftoken=[redacted] HTTP/1.1"),
        (
            "https://app/?code=1&client_secret=s&password=p",
            "https://app/?code=1&client_secret=[redacted]&password=[redacted]",
        ),
        ("GET /a?flowId=1&key=decommission HTTP/1.1", "GET /a?flowId=1&key=decommission HTTP/1.1"),
    ],
)
def test_redaction_keeps_the_line_and_drops_credential_values(text: str, expected: str) -> None:
    from orquestador.serve import redact_query_secrets

    assert redact_query_secrets(text) == expected
