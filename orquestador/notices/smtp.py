"""Delivering one e-mail over SMTP: SMTP_URL parsed once, STARTTLS when the server offers it.

`smtp://host[:port]` talks plain SMTP (port 25 by default) and upgrades with STARTTLS
whenever the server offers it; `smtps://host[:port]` opens TLS at once (port 465 by
default). User and password in the URL (percent-encoded) are sent only over TLS,
never in clear. Errors come back as `DeliveryFailed` with a text safe to store:
never the password.

Headers are built here, not by the email package's parser: user text (a notice title)
is decoded of any RFC 2047 encoded words, stripped of control characters and line
separators, and encoded again by this module, so no header can carry CR or LF however
the text was written, on any Python (3.11 before 3.11.10 decodes an encoded word into a
raw line break, CVE-2024-6923). The serialized header block is checked before sending.
"""

from __future__ import annotations

import base64
import binascii
import re
import smtplib
import socket
import ssl
import time
import unicodedata
from dataclasses import dataclass, field
from email.errors import MessageError
from email.header import Header
from email.message import EmailMessage
from email.policy import default as default_policy
from email.utils import formataddr, formatdate, parseaddr
from typing import Any
from urllib.parse import unquote, urlsplit

from orquestador.errors import ConfigError
from orquestador.notices.preferences import address_problem

# Each network operation (connect, every command) waits at most this long, and the
# whole exchange at most DELIVERY_SECONDS: a server that trickles its replies cannot
# keep a message past the mailer's lease, after which another mailer may send it too.
SMTP_TIMEOUT_SECONDS = 15.0
DELIVERY_SECONDS = 40.0
MAX_ERROR_CHARACTERS = 300
_DEFAULT_PORTS = {"smtp": 25, "smtps": 465}

# =?charset?Q|B?text?= (RFC 2047); the charset may carry an RFC 2231 language (*en).
_ENCODED_WORD = re.compile(r"=\?([^?\s*]+)(?:\*[^?\s]*)?\?([QqBb])\?([^?\s]*)\?=")
# An encoded word inside the decoded text of another is decoded too, a few levels deep;
# anything left is encoded again whole, so a reader decodes it once, to plain text.
_DECODE_ROUNDS = 4
# The envelope sender (SMTP_FROM's address): printable ASCII, no spaces, nothing that
# reshapes an address list. Looser than a recipient's: `orquestador@localhost` is fine.
_SENDER_ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9.-]+")
_MESSAGE_ID = re.compile(r"<[!-;=?-~]+@[!-;=?-~]+>")
_HEADER_LINE = re.compile(rb"([!-9;-~]+): ")
# What every message carries, once each and nothing else.
_HEADER_NAMES = (
    "From",
    "To",
    "Subject",
    "Message-ID",
    "Date",
    "Auto-Submitted",
    "Content-Type",
    "Content-Transfer-Encoding",
    "MIME-Version",
)
# Headers are set raw and emitted as built: the policy never re-parses (and so never
# decodes) them on the way out.
_POLICY = default_policy.clone(refold_source="none")


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


def _word_bytes(match: re.Match[str]) -> tuple[str, bytes] | None:
    """The charset and bytes of one encoded word; None when it cannot be decoded."""
    charset, encoding, payload = match.group(1).lower(), match.group(2).upper(), match.group(3)
    if encoding == "Q":
        raw = payload.replace("_", " ").encode("utf-8", "replace")
        data = re.sub(rb"=([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), raw)
    else:
        try:
            data = base64.b64decode(payload + "=" * (-len(payload) % 4), validate=True)
        except (binascii.Error, ValueError):
            return None
    try:
        data.decode(charset, "replace")
    except (LookupError, ValueError):  # unknown, or not a text encoding (base64, rot13)
        return None
    return charset, data


def _decode_words_once(text: str) -> str:
    out: list[str] = []
    pending: tuple[str, bytes] | None = None
    end = 0

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            out.append(pending[1].decode(pending[0], "replace"))
            pending = None

    for match in _ENCODED_WORD.finditer(text):
        gap = text[end : match.start()]
        word = _word_bytes(match)
        if word is None:
            flush()
            out += [gap, match.group(0)]
        elif pending is not None and not gap.strip() and pending[0] == word[0]:
            # Adjacent words join without the space between them (RFC 2047 6.2), and
            # their bytes join before decoding: a character may be split between them.
            pending = (word[0], pending[1] + word[1])
        else:
            # Between words of two charsets the space goes too; before a word, it stays.
            adjacent = pending is not None and not gap.strip()
            flush()
            if not adjacent:
                out.append(gap)
            pending = word
        end = match.end()
    flush()
    out.append(text[end:])
    return "".join(out)


def header_text(text: str) -> str:
    """User text as a reader would see it in a header, on one line: encoded words decoded,
    then every control character and line separator (CR, LF, U+0085, U+2028...) a space."""
    for _ in range(_DECODE_ROUNDS):
        decoded = _decode_words_once(text)
        if decoded == text:
            break
        text = decoded
    # A decoded charset may yield what UTF-8 cannot carry (a lone surrogate).
    return one_line(text.encode("utf-8", "replace").decode("utf-8"))


def _is_plain(text: str) -> bool:
    return text.isascii() and text.isprintable() and "=?" not in text


def encoded_header(name: str, text: str) -> str:
    """The value of header `name` for `text` (already one line), folded with CRLF.

    Plain ASCII stays readable; anything else, and anything that looks like an encoded
    word, becomes encoded words of its UTF-8, which hold no line break of any kind.
    """
    charset = "us-ascii" if _is_plain(text) else "utf-8"
    return Header(text, charset, header_name=name).encode(linesep="\r\n")


def sender_header(sender: str) -> tuple[str, str]:
    """(From header value, envelope address) of SMTP_FROM; ConfigError when unusable."""
    name, address = parseaddr(sender)
    # parseaddr drops what follows a line break: refuse it rather than guess.
    broken = one_line(sender) != sender.strip()
    if broken or not _SENDER_ADDRESS.fullmatch(address) or address.count("@") != 1:
        raise ConfigError(["SMTP_FROM: an address such as Orquestador <noreply@example.com>"])
    name = header_text(name)
    if not name:
        return address, address
    if _is_plain(name):
        return formataddr((name, address)), address
    return f"{encoded_header('From', name)} <{address}>", address


def build_message(email: OutgoingEmail, sender: str) -> EmailMessage:
    """The message, its headers built here from checked parts; ValueError when it cannot be.

    No header value reaches the email package's parser: each is set raw, so nothing in
    it is decoded again into a line break.
    """
    from_value, _ = sender_header(sender)
    for number, address in enumerate(email.recipients, 1):
        if not isinstance(address, str) or address_problem(address):
            raise ValueError(f"recipient {number} is not a plain address")
    if not email.recipients:
        raise ValueError("no recipients")
    if not _MESSAGE_ID.fullmatch(email.message_id):
        raise ValueError("the Message-ID is not <id@domain>")
    message = EmailMessage(policy=_POLICY)
    message.set_raw("From", from_value)
    message.set_raw("To", encoded_header("To", ", ".join(email.recipients)))
    message.set_raw("Subject", encoded_header("Subject", header_text(email.subject)))
    # The same on every delivery of this notice: receivers deduplicate by it.
    message.set_raw("Message-ID", email.message_id)
    message.set_raw("Date", formatdate(usegmt=True))
    # Tells auto-responders not to answer a machine (RFC 3834).
    message.set_raw("Auto-Submitted", "auto-generated")
    message.set_content(email.body)
    check_header_block(message)
    return message


def check_header_block(message: EmailMessage) -> None:
    """ValueError unless the serialized headers are exactly the ones built, each once.

    The last word on injection: whatever a library version does, a message whose header
    block holds a stray line break, another header or an early end is never sent.
    """
    serialized = message.as_bytes(policy=_POLICY.clone(linesep="\r\n"))
    head, blank, _ = serialized.partition(b"\r\n\r\n")
    if not blank or not head.isascii():
        raise ValueError("the header block is not ASCII lines ending in a blank line")
    names: list[str] = []
    for line in head.split(b"\r\n"):
        if b"\r" in line or b"\n" in line:
            raise ValueError("a header holds a bare line break")
        if line[:1] in (b" ", b"\t"):
            if not names or not line.strip():
                raise ValueError("a header line is folded where it may not be")
            continue
        start = _HEADER_LINE.match(line)
        if start is None:
            raise ValueError("a header line is not `Name: value`")
        names.append(start.group(1).decode("ascii").lower())
    if sorted(names) != sorted(name.lower() for name in _HEADER_NAMES):
        raise ValueError("the headers are not the ones built")


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
        # Checked at start: an SMTP_FROM that cannot be a header stops the worker.
        self.envelope_sender = sender_header(sender)[1]
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
        except (ValueError, TypeError, MessageError) as exc:
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
