"""No text reaches an e-mail header with a line break, however it is encoded (SPEC 16).

Each payload is a notice title as request data could map it; the real mailer delivers
it to a real SMTP server, and what arrives has exactly the headers the product builds,
one From, no Reply-To or Bcc, and the product's own body.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from email.header import decode_header
from email.message import EmailMessage

import pytest
from sqlalchemy import text

from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.notices.smtp import OutgoingEmail, SmtpSender, SmtpTarget
from orquestador.notices.vocabulary import CATEGORY_AUTOMATION
from orquestador.notices.writing import NoticeDraft, write_notice
from orquestador.worker.background import mailer as worker_mailer
from tests.integration.notice_support import (
    ORG,
    RECIPIENTS,
    SENDER,
    new_mailer,
    outbox,
    running,
    set_preferences,
)
from tests.integration.worker_support import wait_until
from tests.smtp_sink import Received, running_sink

BODY = "Machine m-1 has 3% free on /var."
ATTACKER = "attacker@evil.example"
BUILT = {
    "from",
    "to",
    "subject",
    "message-id",
    "date",
    "auto-submitted",
    "content-type",
    "content-transfer-encoding",
    "mime-version",
}


def _b(raw: str) -> str:
    return "=?utf-8?b?" + base64.b64encode(raw.encode("utf-8")).decode("ascii") + "?="


PAYLOADS = {
    "q-encoded CRLF adds Reply-To": f"=?utf-8?q?Invoice=0D=0AReply-To:_{ATTACKER}?=",
    "b-encoded CRLF adds a second From": _b(f"Invoice\r\nFrom: {ATTACKER}"),
    "encoded blank line ends the headers": (
        "=?utf-8?q?Invoice=0D=0A=0D=0A<html><a_href=3D=22https://evil.example=22>pay</a>?="
    ),
    "latin-1 encoded LF adds Bcc": f"=?iso-8859-1?q?Invoice=0ABcc:_{ATTACKER}?=",
    "CRLF split across two words": f"=?utf-8?q?Invoice=0D?= =?utf-8?q?=0AReply-To:_{ATTACKER}?=",
    "an encoded word inside an encoded word": _b(f"=?utf-8?q?Invoice=0D=0AReply-To:_{ATTACKER}?="),
    "raw CR LF": f"Invoice\r\nReply-To: {ATTACKER}",
    "raw LF": f"Invoice\nReply-To: {ATTACKER}",
    "U+2028 line separator": f"Invoice\u2028Reply-To: {ATTACKER}",
    "U+0085 next line": f"Invoice\x85Reply-To: {ATTACKER}",
    "encoded U+2028": _b(f"Invoice\u2028Reply-To: {ATTACKER}"),
}


def _queue(engine, title: str) -> None:
    """A notice whose e-mail is queued with `title` as its subject, as notify@1 writes it."""
    draft = NoticeDraft(
        org_id=ORG,
        external_key=f"{uuid.uuid4()}:notify",
        title=title,
        body=BODY,
        severity="warning",
        category=CATEGORY_AUTOMATION,
        request_id=None,
        execution_id=None,
    )
    with engine.begin() as conn:
        write_notice(conn, draft, email_requested=True)


def _deliver(engine, sender=None) -> Received:
    with running_sink() as sink:
        mailer = new_mailer(engine, sink.url, sender=sender)
        with running(mailer):
            [received] = sink.wait_for(1)
            wait_until(lambda: outbox(engine)[0].status == "sent", what="the row marked sent")
    return received


def _decoded(raw: str) -> str:
    """A header value as any reader decodes it: encoded words and all."""
    return "".join(
        part.decode(charset or "ascii", "replace") if isinstance(part, bytes) else part
        for part, charset in decode_header(raw)
    )


def _assert_only_built_headers(received: Received) -> None:
    message = received.message
    names = [name.lower() for name in message]
    assert sorted(names) == sorted(BUILT), names
    assert message.get_all("From") == [SENDER]
    assert message.get_all("Reply-To") is None and message.get_all("Bcc") is None
    assert received.rcpt_tos == RECIPIENTS
    for name, raw in message.raw_items():
        shown = _decoded(str(raw))
        assert not any(c in shown for c in "\r\n\x85\u2028\u2029"), (name, shown)
        assert ATTACKER not in str(message[name]) or name.lower() == "subject"


@pytest.mark.parametrize("title", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_a_title_never_becomes_another_header_or_the_body(runtime_engine, title):
    set_preferences(runtime_engine)
    _queue(runtime_engine, title)

    received = _deliver(runtime_engine)

    _assert_only_built_headers(received)
    subject = str(received.message["Subject"])
    assert subject.startswith("Invoice") and "\r" not in subject and "\n" not in subject
    assert received.message.get_content().replace("\r\n", "\n").rstrip("\n") == BODY


def test_a_sender_name_with_an_encoded_line_break_stays_one_from(runtime_engine):
    sender = f'"=?utf-8?q?Orquestador=0D=0ABcc:_{ATTACKER}?=" <orquestador@example.com>'
    set_preferences(runtime_engine)
    _queue(runtime_engine, "Backup failed")

    with running_sink() as sink:
        mailer = new_mailer(
            runtime_engine, sink.url, sender=SmtpSender(SmtpTarget.parse(sink.url), sender)
        )
        with running(mailer):
            [received] = sink.wait_for(1)

    assert received.message.get_all("Bcc") is None
    [sent_from] = received.message.get_all("From")
    assert sent_from.addresses[0].addr_spec == "orquestador@example.com"
    shown = sent_from.addresses[0].display_name
    assert shown.startswith("Orquestador") and "\n" not in shown and "\r" not in shown
    assert received.mail_from == "orquestador@example.com"
    assert received.rcpt_tos == RECIPIENTS


@pytest.mark.parametrize(
    "recipient",
    [
        f"=?utf-8?q?ops=0D=0ABcc:_{ATTACKER}?= <ops@example.com>",
        f"ops@example.com\r\nBcc: {ATTACKER}",
        f"ops@example.com, {ATTACKER}",
    ],
    ids=["encoded display name", "raw CR LF", "a second address"],
)
def test_a_recipient_that_is_not_a_plain_address_is_never_mailed(
    runtime_engine, owner_engine, recipient
):
    # The preferences API refuses such addresses; a row written some other way is
    # given up whole rather than mailed to anyone it names.
    set_preferences(runtime_engine)
    _queue(runtime_engine, "Backup failed")
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE email_outbox SET recipients = CAST(:recipients AS jsonb)"),
            {"recipients": json.dumps(["oncall@example.com", recipient])},
        )

    with running_sink() as sink, running(new_mailer(runtime_engine, sink.url)):
        wait_until(lambda: outbox(runtime_engine)[0].status == "failed", what="given up")
        assert sink.received() == []

    [row] = outbox(runtime_engine)
    assert row.attempts == 1
    assert "recipient 2 is not a plain address" in row.last_error
    assert ATTACKER not in row.last_error


@pytest.mark.parametrize(
    "sender", ["Orquestador", f"orquestador@example.com\r\nBcc: {ATTACKER}", "a b@example.com"]
)
def test_an_smtp_from_that_cannot_be_a_header_stops_the_worker_at_start(runtime_engine, sender):
    settings = Settings.from_env({}, smtp_url="smtp://127.0.0.1:25", smtp_from=sender)
    with pytest.raises(ConfigError, match="SMTP_FROM"):
        worker_mailer(settings, runtime_engine, "w1")


def test_the_header_block_check_refuses_what_a_library_might_let_through():
    from orquestador.notices.smtp import check_header_block

    email = OutgoingEmail("<u@orquestador>", RECIPIENTS, "Backup failed", BODY)
    message = EmailMessage()
    for name, value in (
        ("From", SENDER),
        ("To", ", ".join(email.recipients)),
        ("Subject", f"Invoice\r\nReply-To: {ATTACKER}"),
        ("Message-ID", email.message_id),
        ("Date", "Mon, 05 Jan 2026 10:00:00 GMT"),
        ("Auto-Submitted", "auto-generated"),
    ):
        message.set_raw(name, value)
    message.set_content(BODY)
    with pytest.raises(ValueError, match="headers are not the ones built"):
        check_header_block(message)


def test_any_mix_of_encoded_words_and_breaks_builds_only_the_headers_built():
    """A seeded walk through titles made of the pieces injections are made of."""
    from email import message_from_bytes
    from email.policy import default

    from orquestador.notices.smtp import build_message

    pieces = [
        "=?utf-8?q?", "=?utf-8?b?", "=?iso-8859-1?q?", "=?utf-16?b?", "?=", "=?", "?",
        "=0D", "=0A", "DQo=", "Cg==", "AA0ACg==", "\r", "\n", "\v", "\x1c", "\x85",
        "\u2028", "\u2029", "\x00", "\ud800", "\t", " ", "_", "é", "✓", "Reply-To:",
        f"From: {ATTACKER}", "<html>", ":", ";", ",", "x" * 80,
    ]  # fmt: skip
    chosen = random.Random(20)
    for _ in range(2000):
        title = "".join(chosen.choice(pieces) for _ in range(chosen.randint(0, 30)))
        email = OutgoingEmail("<u@orquestador>", RECIPIENTS, title, BODY)
        built = build_message(email, SENDER)
        raw = built.as_bytes(policy=default.clone(linesep="\r\n"))
        back = message_from_bytes(raw, policy=default)
        assert sorted(name.lower() for name in back) == sorted(BUILT), repr(title)
        subject = str(back["Subject"])
        assert "\r" not in subject and "\n" not in subject, repr(title)
        assert back.get_content().rstrip("\r\n") == BODY
