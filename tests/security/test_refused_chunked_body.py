"""The development server answers 413 to an oversized chunked body and closes the
connection: it neither reads the rest of the body (up to gigabytes) nor takes any of it
for a next request."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.serve import serve_in_thread
from tests.integration.api_support import REGISTRY

SECRET = "refused-body-test-secret-" + "0123456789abcdef" * 2
MAX_BODY_BYTES = 4096
# What a smuggler hides in the body, hoping the server parses it as the next request.
SMUGGLED = b"GET /api/v1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
# The server must close within this after its answer, while the client still sends.
CLOSE_WITHIN_SECONDS = 3.0
# How long the client goes on sending unless the connection is closed first.
SEND_FOR_SECONDS = 30.0


@pytest.fixture
def development_server(database) -> Iterator[tuple[int, str]]:
    settings = Settings.from_env(
        {},
        database_url=database.runtime_dsn,
        request_api_enabled=True,
        jwt_secret=SECRET,
        api_max_body_bytes=MAX_BODY_BYTES,
    )
    app = create_app(settings, registry=REGISTRY)
    server, thread = serve_in_thread(app, "127.0.0.1", 0)
    token = mint_token(settings, sub="alice", org="org-a", scopes=["requests:write"])
    try:
        yield server.server_port, token
    finally:
        server.shutdown()
        thread.join(10)
        app.extensions[EXTENSION_KEY].engine.dispose()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _send_until_closed(connection: socket.socket, stop: threading.Event) -> None:
    """Stream chunks without pause, so the server never sees the body end."""
    piece = _chunk(b'"' + SMUGGLED * 300 + b'"')
    deadline = time.monotonic() + SEND_FOR_SECONDS
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            connection.sendall(piece)
            stop.wait(0.002)  # pacing, not synchronisation: a steady stream
    except OSError:
        pass  # closed by the server: what the test wants


def _read_answer(connection: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of one answer with a Content-Length."""
    received = b""
    while b"\r\n\r\n" not in received:
        data = connection.recv(65536)
        assert data, f"closed before an answer: {received!r}"
        received += data
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        data = connection.recv(65536)
        assert data, "closed in the middle of the answer"
        body += data
    return head, body


def test_an_oversized_chunked_body_is_answered_413_and_the_connection_closed(
    development_server: tuple[int, str],
) -> None:
    port, token = development_server
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    stop = threading.Event()
    sender = threading.Thread(target=_send_until_closed, args=(connection, stop), daemon=True)
    try:
        connection.sendall(
            b"POST /api/v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(b'{"flowId": "x", "data": {"pad": ')
        )
        sender.start()
        head, body = _read_answer(connection)
        answered = time.monotonic()
        connection.settimeout(CLOSE_WITHIN_SECONDS)
        rest = b""
        try:
            while data := connection.recv(65536):
                rest += data
        except ConnectionResetError:
            pass  # a reset closes as well as a FIN does
        except TimeoutError:
            pytest.fail(f"still open {CLOSE_WITHIN_SECONDS}s after the 413, reading the body")
        closed_after = time.monotonic() - answered
    finally:
        stop.set()
        sender.join(10)
        connection.close()

    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b'"BODY_TOO_LARGE"' in body
    assert b"connection: close" in head.lower()
    assert rest == b"", f"a second answer: {rest[:200]!r}"
    assert closed_after < CLOSE_WITHIN_SECONDS
