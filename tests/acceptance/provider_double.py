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

Given `instructions` (the promise checker's mode), the double instead obeys an
Instruction per request (answer late, perform late, refuse, cut) and keeps a ledger
with the time of everything it saw and did: see `Call`, `Instruction` and
`LedgerLine` below. It then serves three kinds of route: `/writes` (keyed writes it
deduplicates, an idempotent API), `/charges` (writes it performs every time one
arrives, an API with no idempotency at all) and `/reads` (safe calls that write
nothing); `GET /<route>/<key>` looks a write up. Without `instructions` it behaves as
described above. With `strict`, an instructed write is performed at its moment
whether or not its caller is still there (a provider that never notices a caller
leave): a killed or frozen worker's request still writes.
"""

from __future__ import annotations

import json
import random
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

BEFORE = "before write"  # received, not yet performed: a caller that leaves drops it
AFTER = "after write"  # performed, the answer not yet sent


# The routes of the instructed mode.
WRITES = "writes"  # keyed writes, deduplicated by key: an idempotent API
CHARGES = "charges"  # every write that arrives is performed: no idempotency at all
READS = "reads"  # safe calls: nothing is performed
ROUTES = (WRITES, CHARGES, READS)

# What an instruction tells the double to do with one request.
OK = "ok"  # perform (a write) and answer, at the instruction's moments
TRANSIENT = "transient"  # answer 503, with Retry-After when given; nothing performed
PERMANENT = "permanent"  # answer 422 with a code; nothing performed
CUT_BEFORE = "cut_before"  # close the connection without performing or answering
CUT_AFTER = "cut_after"  # perform, then close the connection without answering
NOT_READY = "not_ready"  # a read: answer 202, "ask again in check_again_in seconds"
BAD_OUTPUT = "bad_output"  # perform, then answer an output that breaks the adapter's schema
UNKNOWN = "unknown"  # a lookup: answer 503, the provider cannot tell
OUTCOMES = (OK, TRANSIENT, PERMANENT, CUT_BEFORE, CUT_AFTER, NOT_READY, BAD_OUTPUT, UNKNOWN)


@dataclass(frozen=True)
class InFlight:
    key: str
    pid: int
    phase: str


@dataclass(frozen=True)
class Call:
    """One request as the instructions see it."""

    route: str
    lookup: bool
    key: str
    case: str  # the caller's X-Case header: which planned case the call belongs to
    ordinal: int  # 1 for the first such request (same route, lookup or not) under this key


@dataclass(frozen=True)
class Instruction:
    """How the double treats one request; the default answers at once and plainly.

    Moments are seconds after the request arrived. A write is performed at
    `perform_at` only if its caller is still connected then (a provider that cancels
    a request with its connection): a write never lands after its caller has gone,
    but it may land long after the caller's own deadline, while the caller still waits.
    """

    outcome: str = OK
    perform_at: float = 0.0
    answer_at: float = 0.0
    retry_after: float | None = None
    check_again_in: float = 1.0

    def describe(self) -> str:
        parts = [self.outcome]
        if self.perform_at:
            parts.append(f"perform at {self.perform_at:.2f}s")
        if self.answer_at:
            parts.append(f"answer at {self.answer_at:.2f}s")
        if self.retry_after is not None:
            parts.append(f"retry after {self.retry_after:.2f}s")
        if self.outcome == NOT_READY:
            parts.append(f"check again in {self.check_again_in:.2f}s")
        return ", ".join(parts)


@dataclass(frozen=True)
class LedgerLine:
    """Something the double saw or did, with the wall-clock time it happened."""

    at: float  # time.time()
    event: str  # arrived, performed, deduplicated, dropped, answered, cut, unanswered
    route: str
    key: str
    ordinal: int
    lookup: bool
    pid: int
    sent_at: float  # the caller's wall clock when it sent the request (X-Sent-At), or 0
    detail: str = ""
    slot: str = ""  # the caller's X-Slot header: a concurrency key's value, if any

    def __str__(self) -> str:
        kind = f"{self.route} lookup" if self.lookup else self.route
        detail = f" ({self.detail})" if self.detail else ""
        slot = f" slot={self.slot}" if self.slot else ""
        return (
            f"{_clock(self.at)} {self.event:<12} {kind} #{self.ordinal} {self.key}"
            f" pid={self.pid}{slot}{detail}"
        )


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]


class ProviderDouble:
    """The provider's state; serve() runs it on a free port in a thread."""

    def __init__(
        self,
        seed: int,
        pause: float = 0.12,
        cut_rate: float = 0.08,
        instructions: Callable[[Call], Instruction] | None = None,
        strict: bool = False,
    ) -> None:
        self.pause = pause
        self.strict = strict
        self.instructions = instructions
        self._obeying = instructions is not None
        self._idle = threading.Condition()
        self._ordinals: Counter[tuple[str, bool, str]] = Counter()
        self._ledger: list[LedgerLine] = []
        self._record_numbers = 0
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
                if provider.instructions is None:
                    provider._write(self)
                else:
                    provider._serve_instructed(self, lookup=False)

            def do_GET(self) -> None:
                if provider.instructions is None:
                    provider._look_up(self)
                else:
                    provider._serve_instructed(self, lookup=True)

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

    # --- the instructed mode: what the checker reads ------------------------------------

    def ledger(self, key: str | None = None) -> list[LedgerLine]:
        """Every line so far (of one key), in the order they happened."""
        with self._lock:
            return [line for line in self._ledger if key is None or line.key == key]

    def stop_obeying(self) -> None:
        """From now on every request is answered plainly: the faults are over."""
        with self._lock:
            self._obeying = False

    def wait_until_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; whether that happened within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while True:
                with self._lock:
                    if not self._in_flight:
                        return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)

    # --- the instructed mode: serving ---------------------------------------------------

    def _serve_instructed(self, handler: BaseHTTPRequestHandler, lookup: bool) -> None:
        parts = handler.path.strip("/").split("/", 1)
        route = parts[0]
        if route not in ROUTES or (lookup and (route == READS or len(parts) != 2)):
            _answer(handler, 404, {"error": "no such route"})
            return
        if lookup:
            key = unquote(parts[1])
        else:
            key = handler.headers.get("Idempotency-Key", "")
            handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        pid = int(handler.headers.get("X-Worker-Pid", "0"))
        sent_at = float(handler.headers.get("X-Sent-At", "0"))
        slot = handler.headers.get("X-Slot", "")
        arrived = time.monotonic()
        with self._lock:
            self._ordinals[(route, lookup, key)] += 1
            ordinal = self._ordinals[(route, lookup, key)]
            self._next_request += 1
            request = self._next_request
            self._in_flight[request] = InFlight(key, pid, BEFORE)
            obeying = self._obeying
        call = Call(route, lookup, key, handler.headers.get("X-Case", ""), ordinal)
        instruction = self.instructions(call) if obeying and self.instructions else Instruction()

        def note(event: str, detail: str = "") -> None:
            line = LedgerLine(
                time.time(), event, route, key, ordinal, lookup, pid, sent_at, detail, slot
            )
            with self._lock:
                self._ledger.append(line)

        def wait_for(moment: float, whatever: bool = False) -> bool:
            """Wait until `moment` seconds after arrival; False if the caller hung up.

            With `whatever`, a caller that hangs up does not end the wait early.
            """
            left = max(0.0, arrived + moment - time.monotonic())
            present = not _hung_up(handler.connection, left)
            if whatever:
                time.sleep(max(0.0, arrived + moment - time.monotonic()))
            return present

        note("arrived", instruction.describe())
        try:
            if lookup:
                self._answer_lookup(handler, call, instruction, note, wait_for)
            else:
                self._answer_call(handler, call, instruction, note, wait_for, request)
        finally:
            with self._lock:
                self._in_flight.pop(request, None)
            with self._idle:
                self._idle.notify_all()

    def _answer_call(
        self,
        handler: BaseHTTPRequestHandler,
        call: Call,
        instruction: Instruction,
        note: Callable[..., None],
        wait_for: Callable[..., bool],
        request: int,
    ) -> None:
        outcome = instruction.outcome
        if outcome == CUT_BEFORE:
            wait_for(instruction.answer_at)
            note("cut", "nothing performed")
            return
        if outcome in (TRANSIENT, PERMANENT, NOT_READY, UNKNOWN):
            if not wait_for(instruction.answer_at):
                note("unanswered", "the caller hung up")
                return
            self._refuse(handler, instruction, note)
            return
        record: dict[str, str] = {"quote": "100"}
        if call.route != READS:
            present = wait_for(instruction.perform_at, self.strict)
            if not present and not self.strict:
                note("dropped", "the caller hung up before the write")
                return
            record = self._perform_instructed(call, note, request)
            if not present:
                note("unanswered", "the caller had hung up before the write")
                return
        if outcome == CUT_AFTER:
            wait_for(instruction.answer_at)
            note("cut", "after the write")
            return
        if not wait_for(instruction.answer_at):
            note("unanswered", "the caller hung up")
            return
        body: dict[str, object] = dict(record)
        if outcome == BAD_OUTPUT:
            body = {name: 0 for name in record}  # a number where a string is due
        try:
            _answer(handler, 201 if call.route != READS else 200, body)
        except OSError:
            note("unanswered", "the connection broke")
            return
        note("answered", json.dumps(body))

    def _perform_instructed(
        self, call: Call, note: Callable[..., None], request: int
    ) -> dict[str, str]:
        with self._key_lock(call.key), self._lock:
            record = self._records.get(call.key)
            if call.route == WRITES and record is not None:
                self.repeats[call.key] += 1
                event = "deduplicated"
            else:
                self._record_numbers += 1
                name = "chargeId" if call.route == CHARGES else "writeId"
                record = {name: f"{call.route[0]}-{self._record_numbers}"}
                self._records[call.key] = record
                self.performed[call.key] += 1
                event = "performed"
            flight = self._in_flight[request]
            self._in_flight[request] = InFlight(flight.key, flight.pid, AFTER)
        note(event, json.dumps(record))
        return record

    def _refuse(
        self, handler: BaseHTTPRequestHandler, instruction: Instruction, note: Callable[..., None]
    ) -> None:
        status, body, headers = 503, {"error": "try again later"}, {}
        if instruction.outcome == PERMANENT:
            status, body = 422, {"code": "DECLINED"}
        elif instruction.outcome == NOT_READY:
            status, body = 202, {"checkAgainIn": instruction.check_again_in}
        elif instruction.retry_after is not None:
            headers = {"Retry-After": f"{instruction.retry_after:.3f}"}
        try:
            _answer(handler, status, body, headers)
        except OSError:
            note("unanswered", "the connection broke")
            return
        note("answered", f"{status} {json.dumps(body)}")

    def _answer_lookup(
        self,
        handler: BaseHTTPRequestHandler,
        call: Call,
        instruction: Instruction,
        note: Callable[..., None],
        wait_for: Callable[[float], bool],
    ) -> None:
        if not wait_for(instruction.answer_at):
            note("unanswered", "the caller hung up")
            return
        if instruction.outcome != OK:
            try:
                _answer(handler, 503, {"error": "cannot tell"})
            except OSError:
                note("unanswered", "the connection broke")
                return
            note("answered", "unknown")
            return
        with self._key_lock(call.key), self._lock:
            self.lookups[call.key] += 1
            record = self._records.get(call.key)
            if record is None:
                self.not_found_answers += 1
        try:
            if record is None:
                _answer(handler, 404, {"error": "no write under this key"})
            else:
                _answer(handler, 200, record)
        except OSError:
            note("unanswered", "the connection broke")
            return
        note("answered", "not found" if record is None else f"found {json.dumps(record)}")


def _answer(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: Mapping[str, object],
    headers: Mapping[str, str] | None = None,
) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
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
