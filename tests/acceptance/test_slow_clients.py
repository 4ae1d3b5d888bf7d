"""The shipped nginx configuration in front of gunicorn holds under slow clients.

With the documented 2 x 4 threads, clients that send their request a header line a
second (or a head and then no body) each held a gunicorn thread: sixteen of them starved
/healthz. Through nginx they never reach gunicorn: /healthz answers all along, and nginx
cuts them at its header and body timeouts. nginx's own refusals (a body too large) are
the API's problem documents, and /metrics is not served on the public port.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.proxy_support import (
    free_port,
    running_api,
    running_nginx,
    status_of,
    wait_for,
)
from tests.db_support import TestDatabase

JWT_SECRET = "slow-clients-test-signing-key-0123456789"
SLOW_CLIENTS = 16


class SlowClient(threading.Thread):
    """A client that never finishes its request: a head sent a line a second (`body`
    False), or a whole head announcing a body it never sends. `cut` is set once the
    server closes the connection."""

    def __init__(self, port: int, *, body: bool) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.body = body
        self.connected = threading.Event()
        self.cut = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
            head = b"GET /api/v1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            if self.body:
                head = (
                    b"POST /api/v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                )
            connection.sendall(head)
            self.connected.set()
            line = 0
            while not self.stop.is_set():
                readable, _, _ = select.select([connection], [], [], 1.0)
                try:
                    if readable and not connection.recv(4096):
                        break  # closed by the server (after its 408, or without one)
                    if not readable and not self.body:
                        connection.sendall(f"X-Slow-{line}: 1\r\n".encode())
                        line += 1
                except OSError:
                    break
            else:
                return
        self.cut.set()


@pytest.fixture
def proxied_api(database: TestDatabase, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """gunicorn as documented (2 workers x 4 threads) behind the shipped nginx: (the
    proxy's URL, gunicorn's own URL)."""
    port = free_port()
    env = {
        "DATABASE_URL": database.runtime_dsn,
        "API_PORT": str(port),
        "API_WORKERS": "2",
        "API_THREADS": "4",
        "REQUEST_API_ENABLED": "true",
        "JWT_SECRET": JWT_SECRET,
        "TRUSTED_PROXIES": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
    }
    with running_api(env, tmp_path / "api.log"), running_nginx(f"127.0.0.1:{port}") as proxy:
        api = f"http://127.0.0.1:{port}"
        wait_for(lambda: status_of(f"{api}/api/v1/healthz") == 200, 60, "gunicorn")
        yield f"http://127.0.0.1:{proxy}", api


def test_slow_clients_never_reach_gunicorn_and_healthz_answers_through_the_proxy(
    proxied_api: tuple[str, str],
) -> None:
    proxy, _ = proxied_api
    port = int(proxy.rsplit(":", 1)[1])
    clients = [SlowClient(port, body=n % 2 == 1) for n in range(SLOW_CLIENTS)]
    for client in clients:
        client.start()
    try:
        for client in clients:
            assert client.connected.wait(10)
        # Twice the threads gunicorn has are held by unfinished requests now: not one of
        # them is gunicorn's, so every probe is answered.
        answers = [status_of(f"{proxy}/api/v1/healthz", timeout=30) for _ in range(6)]
        assert answers == [200] * 6
        # nginx cuts each at its header or body timeout (10 s), whatever it still sends.
        for client in clients:
            assert client.cut.wait(60), "a slow client outlived nginx's timeouts"
    finally:
        for client in clients:
            client.stop.set()
            client.join(10)


def test_the_proxy_refuses_a_large_body_as_a_problem_and_hides_metrics(
    proxied_api: tuple[str, str],
) -> None:
    proxy, api = proxied_api
    request = urllib.request.Request(
        f"{proxy}/api/v1/requests",
        data=b"{" + b" " * (2 << 20) + b"}",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert refused.value.headers["Content-Type"] == "application/problem+json"
    assert json.loads(refused.value.read())["code"] == "BODY_TOO_LARGE"

    assert status_of(f"{proxy}/metrics") == 404
    assert status_of(f"{api}/metrics") == 200  # on gunicorn's own port, for its host
