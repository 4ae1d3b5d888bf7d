"""An HTTP provider double on 127.0.0.1 for integration routes: keyed effects it counts.

`POST` to any path under `/v1/` performs a write keyed by its `Idempotency-Key`
and answers `201 {"id", "status", "path"}`; a key it already performed gets the
first answer again and creates nothing (counted as a repeat). `GET
/v1/invoices?idempotency_key=K` answers `{"data": [record]}` or `{"data": []}`.
`POST /v1/verify` (or `/v2/verifications`) answers a document verification. Every
request is recorded as received (method, raw path, Host, headers, body) so tests can
assert where a call went and what it carried. `GET /_double/writes` shows what the
double performed: `{"writes": [{"path", "key", "effects", "repeats"}]}`, one item per
key in the order first received.

Run on its own (`python -m tests.integration.route_provider --port 8081`) it serves
until interrupted, so a reader can follow docs/INTEGRATIONS.md by hand.

Tests script the next answers with `then(...)`: a status with headers and body,
`HANG` (perform, then hold the answer until the caller gives up or the test
releases it), `RESET_AFTER_COMMIT` (perform, then reset the connection), `BIG`
(an answer past 1 MiB) or `REDIRECT`.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HANG = "hang"
RESET_AFTER_COMMIT = "reset after commit"
BIG = "big"
REDIRECT = "redirect"
VERIFICATION_PATHS = ("/v1/verify", "/v2/verifications")


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    method: str
    path: str  # as sent on the request line: nothing decoded
    host: str
    headers: dict[str, str]
    body: bytes


class RouteProvider:
    """The provider's state; serve() runs it on a free port in a thread."""

    def __init__(self, hang_seconds: float = 10.0) -> None:
        self.hang_seconds = hang_seconds
        self._lock = threading.Lock()
        self._script: list[Any] = []
        self.records: dict[str, dict[str, Any]] = {}
        self.effects: Counter[str] = Counter()
        self.repeats: Counter[str] = Counter()
        self.received: list[Received] = []
        self.release = threading.Event()
        # Writes performed whose answer the double is holding back (HANG), as received.
        self.holding: list[Received] = []
        self.url = ""
        self.port = 0

    def then(self, *answers: Any) -> RouteProvider:
        """The next write requests get these answers, in order; afterwards, normal service."""
        with self._lock:
            self._script.extend(answers)
        return self

    def held(self) -> list[Received]:
        with self._lock:
            return list(self.holding)

    def writes(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.method == "POST"]

    def writes_performed(self) -> list[dict[str, Any]]:
        """One item per key written to, in the order first received: what it did with it."""
        with self._lock:
            seen: dict[str, dict[str, Any]] = {}
            for received in self.received:
                if received.method not in ("POST", "PUT"):
                    continue
                key = received.headers.get("Idempotency-Key", "")
                if key not in seen:
                    seen[key] = {"path": urlsplit(received.path).path, "key": key}
            return [
                {**item, "effects": self.effects[key], "repeats": self.repeats[key]}
                for key, item in seen.items()
            ]

    @contextmanager
    def serve(self, port: int = 0) -> Iterator[RouteProvider]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                provider._write(self)

            def do_PUT(self) -> None:
                provider._write(self)

            def do_GET(self) -> None:
                provider._read(self)

            def finish(self) -> None:
                # A connection the double reset itself has nothing left to flush.
                with contextlib.suppress(OSError, ValueError):
                    super().finish()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            server.shutdown()
            server.server_close()
            thread.join(10)

    def _receive(self, handler: BaseHTTPRequestHandler) -> Received:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0") or 0))
        received = Received(
            handler.command,
            handler.path,
            handler.headers.get("Host", ""),
            {k: v for k, v in handler.headers.items()},
            body,
        )
        with self._lock:
            self.received.append(received)
        return received

    def _next(self) -> Any:
        with self._lock:
            return self._script.pop(0) if self._script else None

    def _write(self, handler: BaseHTTPRequestHandler) -> None:
        received = self._receive(handler)
        key = handler.headers.get("Idempotency-Key", "")
        scripted = self._next()
        if isinstance(scripted, Answer):
            _answer(handler, scripted.status, scripted.body, scripted.headers)
            return
        if scripted == REDIRECT:
            _answer(handler, 302, {}, {"Location": "http://127.0.0.2:1/elsewhere"})
            return
        if scripted == BIG:
            _answer(handler, 200, {"id": "x", "padding": "a" * (1024 * 1024 + 10)})
            return
        with self._lock:
            first = self.records.get(key)
            if first is not None:
                self.repeats[key] += 1
            else:
                self.effects[key] += 1
                first = self._record(received, key)
                self.records[key] = first
        if scripted == RESET_AFTER_COMMIT:
            _reset(handler)
            return
        if scripted == HANG:
            with self._lock:
                self.holding.append(received)
            _wait_for_hang_up(handler.connection, self.release, self.hang_seconds)
            with self._lock:
                self.holding.remove(received)
            _reset(handler)
            return
        _answer(handler, 201, first)

    def _record(self, received: Received, key: str) -> dict[str, Any]:
        path = urlsplit(received.path).path
        if path in VERIFICATION_PATHS:
            number = json.loads(received.body or b"{}").get("documentNumber", "")
            if number.startswith("X"):
                return {"status": "REJECTED", "reasons": ["expired"], "reference": f"ver-{key}"}
            return {"status": "VERIFIED", "reasons": [], "reference": f"ver-{key}"}
        return {"id": f"inv-{len(self.records) + 1}", "status": "draft", "path": path}

    def _read(self, handler: BaseHTTPRequestHandler) -> None:
        received = self._receive(handler)
        parts = urlsplit(received.path)
        if parts.path == "/_double/writes":
            _answer(handler, 200, {"writes": self.writes_performed()})
            return
        if parts.path != "/v1/invoices":
            _answer(handler, 404, {"code": "NOT_FOUND"})
            return
        key = parse_qs(parts.query).get("idempotency_key", [""])[0]
        with self._lock:
            record = self.records.get(key)
        _answer(handler, 200, {"data": [record] if record else []})


def _answer(
    handler: BaseHTTPRequestHandler, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)
    handler.wfile.flush()


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close with RST: the caller sees a reset, never an answer."""
    handler.close_connection = True
    try:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    except OSError:
        pass


def _wait_for_hang_up(connection: socket.socket, release: threading.Event, seconds: float) -> None:
    """Hold the answer until the caller closes its end, the test releases it, or time runs out."""
    waited = 0.0
    while waited < seconds and not release.is_set():
        readable, _, _ = select.select([connection], [], [], 0.05)
        waited += 0.05
        if readable:
            try:
                if connection.recv(1, socket.MSG_PEEK) == b"":
                    return
            except OSError:
                return


def main() -> None:
    import argparse
    import time

    parser = argparse.ArgumentParser(description="the provider double, on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    port = parser.parse_args().port
    with RouteProvider().serve(port) as provider:
        print(f"provider double on {provider.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
