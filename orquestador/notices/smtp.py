"""Delivering one e-mail over SMTP: SMTP_URL parsed once, STARTTLS when the server offers it.

`smtp://host[:port]` talks plain SMTP (port 25 by default) and upgrades with STARTTLS
whenever the server offers it; `smtps://host[:port]` opens TLS at once (port 465 by
default). User and password in the URL (percent-encoded) are sent only over TLS,
never in clear. Errors come back as `DeliveryFailed` with a text safe to store:
never the password.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
import time
import unicodedata
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import Any
from urllib.parse import unquote, urlsplit

from orquestador.errors import ConfigError

# Each network operation (connect, every command) waits at most this long, and the
# whole exchange at most DELIVERY_SECONDS: a server that trickles its replies cannot
# keep a message past the mailer's lease, after which another mailer may send it too.
SMTP_TIMEOUT_SECONDS = 15.0
DELIVERY_SECONDS = 40.0
MAX_ERROR_CHARACTERS = 300
_DEFAULT_PORTS = {"smtp": 25, "smtps": 465}


class DeliveryFailed(Exception):
    """The server did not take the message.

    `permanent` when it said so for good (a 5xx reply): trying again cannot help.
    """

    def __init__(self, safe_text: str, *, permanent: bool) -> None:
        super().__init__(safe_text)
        self.safe_text = safe_text
        self.permanent = permanent


@dataclass(frozen=True)
class SmtpTarget:
    """Where and how to deliver, from SMTP_URL."""

    host: str
    port: int
    implicit_tls: bool
    username: str = ""
    password: str = field(default="", repr=False)

    @classmethod
    def parse(cls, url: str) -> SmtpTarget:
        """The target of `url`; ConfigError naming the problem (never the password)."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ConfigError(["SMTP_URL: not a URL with a valid port"]) from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ConfigError(["SMTP_URL: the scheme must be smtp:// or smtps://"])
        if not parts.hostname:
            raise ConfigError(["SMTP_URL: no host, e.g. smtp://mail.example.com:587"])
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(["SMTP_URL: only scheme, credentials, host and port are read"])
        return cls(
            host=parts.hostname,
            port=port or _DEFAULT_PORTS[scheme],
            implicit_tls=scheme == "smtps",
            username=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
        )

    def describe(self) -> str:
        """Where it delivers, fit for a log line: no credentials."""
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"{scheme}://{self.host}:{self.port}"


@dataclass(frozen=True)
class OutgoingEmail:
    message_id: str
    recipients: list[str]
    subject: str
    body: str


def one_line(text: str) -> str:
    """`text` fit for a header: every control character and line separator becomes a space.

    notify@1 refuses such titles; this keeps any other writer's row from poisoning the
    outbox with a message that cannot be built.
    """
    return "".join(
        " " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text
    ).strip()


def build_message(email: OutgoingEmail, sender: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = ", ".join(email.recipients)
    message["Subject"] = one_line(email.subject)
    # The same on every delivery of this notice: receivers deduplicate by it.
    message["Message-ID"] = email.message_id
    message["Date"] = formatdate(usegmt=True)
    # Tells auto-responders not to answer a machine (RFC 3834).
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(email.body)
    return message


class _Deadline:
    """Gives every command and reply of one exchange what is left of its deadline."""

    sock: socket.socket | None

    def __init__(self, *args: Any, deadline: float, step_seconds: float, **kwargs: Any) -> None:
        self.deadline = deadline
        self.step_seconds = step_seconds
        super().__init__(*args, **kwargs)

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the SMTP exchange ran past its deadline")
        if self.sock is not None:
            self.sock.settimeout(min(self.step_seconds, left))

    def send(self, s: Any) -> None:
        self._arm()
        super().send(s)  # type: ignore[misc]

    def getreply(self) -> tuple[int, bytes]:
        self._arm()
        return super().getreply()  # type: ignore[misc]


class _DeadlineSMTP(_Deadline, smtplib.SMTP):
    pass


class _DeadlineSMTPSSL(_Deadline, smtplib.SMTP_SSL):
    pass


def _say_goodbye(client: smtplib.SMTP) -> None:
    """QUIT, and close whatever it answers: once the server took the message, a bad reply
    to QUIT must not make it look undelivered (it would be sent again)."""
    try:
        client.quit()
    except (smtplib.SMTPException, OSError):
        client.close()


class SmtpSender:
    """Sends each message over a connection of its own."""

    def __init__(
        self,
        target: SmtpTarget,
        sender: str,
        *,
        timeout_seconds: float = SMTP_TIMEOUT_SECONDS,
        delivery_seconds: float = DELIVERY_SECONDS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.target = target
        self.sender = sender
        self.envelope_sender = parseaddr(sender)[1] or sender
        self.timeout_seconds = timeout_seconds
        self.delivery_seconds = delivery_seconds
        self._ssl_context = ssl_context

    def _context(self) -> ssl.SSLContext:
        return self._ssl_context or ssl.create_default_context()

    def _connect(self) -> smtplib.SMTP:
        # gethostname, not smtplib's default getfqdn: a reverse lookup may hang for seconds.
        name = socket.gethostname()
        target = self.target
        limits = {
            "deadline": time.monotonic() + self.delivery_seconds,
            "step_seconds": self.timeout_seconds,
            "timeout": min(self.timeout_seconds, self.delivery_seconds),
        }
        if target.implicit_tls:
            return _DeadlineSMTPSSL(
                target.host, target.port, local_hostname=name, context=self._context(), **limits
            )
        return _DeadlineSMTP(target.host, target.port, local_hostname=name, **limits)

    def send(self, email: OutgoingEmail) -> list[str]:
        """Deliver `email`; the recipients the server refused (others were accepted)."""
        try:
            return self._send(email)
        except DeliveryFailed:
            raise
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            raise DeliveryFailed(
                self._safe(f"every recipient refused (codes {sorted(set(codes))})"),
                permanent=all(500 <= code < 600 for code in codes),
            ) from None
        except smtplib.SMTPResponseException as exc:
            reply = exc.smtp_error
            text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
            raise DeliveryFailed(
                self._safe(f"{type(exc).__name__}: {exc.smtp_code} {text}"),
                # An authentication refusal is the operator's to fix: keep the message.
                permanent=500 <= exc.smtp_code < 600
                and not isinstance(exc, smtplib.SMTPAuthenticationError),
            ) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryFailed(
                self._safe(f"{type(exc).__name__}: {exc}"), permanent=False
            ) from None

    def _send(self, email: OutgoingEmail) -> list[str]:
        try:
            message = build_message(email, self.sender)
        except (ValueError, TypeError) as exc:
            # No server will ever take it: give the row up instead of retrying it.
            raise DeliveryFailed(
                self._safe(f"the message cannot be built: {type(exc).__name__}: {exc}"),
                permanent=True,
            ) from None
        client = self._connect()
        try:
            client.ehlo()
            encrypted = self.target.implicit_tls
            if not encrypted and client.has_extn("starttls"):
                client.starttls(context=self._context())
                client.ehlo()
                encrypted = True
            if self.target.username:
                if not encrypted:
                    raise DeliveryFailed(
                        "the server offers no STARTTLS: credentials are never sent in clear",
                        permanent=False,
                    )
                client.login(self.target.username, self.target.password)
            refused = client.send_message(
                message, from_addr=self.envelope_sender, to_addrs=email.recipients
            )
        finally:
            _say_goodbye(client)
        return sorted(refused)

    def _safe(self, text: str) -> str:
        """Error text fit to store and log: one line, bounded, without the password."""
        if self.target.password:
            text = text.replace(self.target.password, "***")
        text = " ".join(text.split())
        return text[:MAX_ERROR_CHARACTERS]
