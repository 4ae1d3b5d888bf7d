"""A provider double on 127.0.0.1: keyed writes it counts, and lookups by key.

`POST /writes` with an `Idempotency-Key` header performs a write and answers
`{"writeId": ...}`; `GET /writes/<key>` answers the same record, or 404 when no
write was performed under that key. The double counts what it *performs* per key,
and every request that arrives for a key it already performed (it answers those
from its record, as a deduplicating provider would, and counts them as repeats):
a correct engine makes each key's write performed once and never repeats one.

Each write takes two short pauses, so that a worker can die while its call is in
flight: before performing, the double waits to see whether the caller hangs up (a
request whose caller is gone is dropped, as a server that cancels a request with
its connection would); after performing, it waits again before answering, and a
caller that hung up meanwhile never hears of the write. It can also cut a
connection itself, before or after performing, as a network would. Requests for the
same key are served one at a time, so a lookup never sees a write half done.
"""

from __future__ import annotations

import json
import random
import select
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

BEFORE = "before write"  # received, not yet performed: a caller that leaves drops it
AFTER = "after write"  # performed, the answer not yet sent


@dataclass(frozen=True)
class InFlight:
    key: str
    pid: int
    phase: str


class ProviderDouble:
    """The provider's state; serve() runs it on a free port in a thread."""

    def __init__(self, seed: int, pause: float = 0.12, cut_rate: float = 0.08) -> None:
        self.pause = pause
        self.cut_rate = cut_rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._records: dict[str, dict[str, str]] = {}
        self._in_flight: dict[int, InFlight] = {}
        self._next_request = 0
        self.performed: Counter[str] = Counter()
        self.repeats: Counter[str] = Counter()
        self.lookups: Counter[str] = Counter()
        self.not_found_answers = 0
        # Performed writes whose answer never reached the caller: cut by the double, or
        # the caller died waiting for it.
        self.unanswered: set[str] = set()
        self.caller_gone_after_write: set[str] = set()
        # Requests dropped because their caller died before the write.
        self.caller_gone_before_write = 0
        self.answered = 0
        self.url = ""

    # --- what the test reads ------------------------------------------------------------

    def in_flight(self) -> list[InFlight]:
        with self._lock:
            return list(self._in_flight.values())

    def record(self, key: str) -> dict[str, str] | None:
        with self._lock:
            return self._records.get(key)

    def answered_count(self) -> int:
        with self._lock:
            return self.answered

    # --- serving ------------------------------------------------------------------------

    @contextmanager
    def serve(self) -> Iterator[ProviderDouble]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                provider._write(self)

            def do_GET(self) -> None:
                provider._look_up(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _chance(self) -> bool:
        with self._lock:
            return self._random.random() < self.cut_rate

    def _write(self, handler: BaseHTTPRequestHandler) -> None:
        key = handler.headers["Idempotency-Key"]
        pid = int(handler.headers.get("X-Worker-Pid", "0"))
        handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        with self._key_lock(key):
            with self._lock:
                record = self._records.get(key)
                if record is not None:
                    self.repeats[key] += 1
            if record is not None:
                _answer(handler, 200, record)
                return
            with self._lock:
                self._next_request += 1
                request = self._next_request
                self._in_flight[request] = InFlight(key, pid, BEFORE)
            try:
                self._perform(handler, key, request)
            finally:
                with self._lock:
                    self._in_flight.pop(request, None)

    def _perform(self, handler: BaseHTTPRequestHandler, key: str, request: int) -> None:
        if self._chance():
            return  # the connection is cut before anything happened
        if _hung_up(handler.connection, self.pause):
            with self._lock:
                self.caller_gone_before_write += 1
            return  # the caller left before the write: dropped
        with self._lock:
            self.performed[key] += 1
            record = {"writeId": f"w-{len(self._records) + 1}"}
            self._records[key] = record
            self._in_flight[request] = InFlight(key, self._in_flight[request].pid, AFTER)
        if self._chance():
            with self._lock:
                self.unanswered.add(key)
            return  # the connection is cut after the write
        if _hung_up(handler.connection, self.pause):
            with self._lock:
                self.unanswered.add(key)
                self.caller_gone_after_write.add(key)
            return  # the caller died waiting for the answer
        try:
            _answer(handler, 201, record)
        except OSError:
            with self._lock:
                self.unanswered.add(key)
                self.caller_gone_after_write.add(key)
            return
        with self._lock:
            self.answered += 1

    def _look_up(self, handler: BaseHTTPRequestHandler) -> None:
        prefix = "/writes/"
        if not handler.path.startswith(prefix):
            _answer(handler, 404, {"error": "no such route"})
            return
        key = unquote(handler.path[len(prefix) :])
        with self._key_lock(key):
            with self._lock:
                self.lookups[key] += 1
                record = self._records.get(key)
                if record is None:
                    self.not_found_answers += 1
            if record is None:
                _answer(handler, 404, {"error": "no write under this key"})
            else:
                _answer(handler, 200, record)


def _answer(handler: BaseHTTPRequestHandler, status: int, body: dict[str, str]) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
    handler.wfile.flush()


def _hung_up(connection: socket.socket, seconds: float) -> bool:
    """Wait up to `seconds` for the caller to close its end; whether it did."""
    readable, _, _ = select.select([connection], [], [], seconds)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
