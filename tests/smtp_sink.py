"""A real SMTP server for tests: aiosmtpd on 127.0.0.1, recording every message it accepts.

`SmtpSink` can be stopped and started again on the same port (the server going down
and coming back), offer STARTTLS with a throwaway certificate, and hold its reply to
DATA after recording the message (the server has the message; the sender does not
know yet). `silent_listener` accepts connections and never greets: a sender stays
stuck before delivering.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from email.policy import default
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: Message
    tls: bool

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.sink.refuse_recipients:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        received = Received(
            mail_from=envelope.mail_from,
            rcpt_tos=list(envelope.rcpt_tos),
            message=message_from_bytes(envelope.original_content, policy=default),
            tls=session.ssl is not None,
        )
        with self.sink.lock:
            self.sink.messages.append(received)
            self.sink.arrived.notify_all()
        while self.sink.holding.is_set():
            await asyncio.sleep(0.02)
        return "250 OK"


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written as PEM files in `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "sink-cert.pem", folder / "sink-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class SmtpSink:
    """An SMTP server on 127.0.0.1:`port`; `messages` holds what it accepted, in order."""

    def __init__(self, port: int | None = None, tls_context: ssl.SSLContext | None = None) -> None:
        self.port = port or free_port()
        self.tls_context = tls_context
        self.messages: list[Received] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.holding = threading.Event()
        # Answer every RCPT with a permanent refusal (550).
        self.refuse_recipients = False
        self._controller: Controller | None = None

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def start(self) -> SmtpSink:
        self._controller = Controller(
            _Handler(self),
            hostname="127.0.0.1",
            port=self.port,
            tls_context=self.tls_context,
            require_starttls=False,
            ready_timeout=10,
        )
        self._controller.start()
        return self

    def stop(self) -> None:
        self.holding.clear()
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.messages)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        """The messages once at least `count` arrived; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.messages)} message(s), expected {count}")
                self.arrived.wait(left)
            return list(self.messages)


@contextmanager
def running_sink(**kwargs: Any) -> Iterator[SmtpSink]:
    sink = SmtpSink(**kwargs).start()
    try:
        yield sink
    finally:
        sink.stop()


@contextmanager
def silent_listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A port that accepts connections and never says a word; the accepted sockets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(2)
        for connection in accepted:
            connection.close()
        server.close()


@contextmanager
def trickling_server(delay_seconds: float, quit_reply: bytes = b"221 bye") -> Iterator[int]:
    """A port whose server answers every SMTP line correctly, each after `delay_seconds`.

    `quit_reply` is what it says to QUIT, after which it hangs up.
    """
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def talk(connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as lines:
            try:
                time.sleep(delay_seconds)
                connection.sendall(b"220 slow.example ESMTP\r\n")
                in_data = False
                for line in lines:
                    if stop.is_set():
                        return
                    if in_data:
                        if line.rstrip(b"\r\n") == b".":
                            in_data = False
                            time.sleep(delay_seconds)
                            connection.sendall(b"250 taken\r\n")
                        continue
                    time.sleep(delay_seconds)
                    if line.upper().startswith(b"QUIT"):
                        connection.sendall(quit_reply + b"\r\n")
                        return
                    if line.upper().startswith(b"DATA"):
                        in_data = True
                        connection.sendall(b"354 go on\r\n")
                    else:
                        connection.sendall(b"250 ok\r\n")
            except OSError:
                return

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=talk, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        server.close()
