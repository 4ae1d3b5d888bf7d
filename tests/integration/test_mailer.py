"""The worker's mailer against a real SMTP server: one delivery per row, backoff, a bound."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import text

from orquestador.backoff import Backoff
from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.notices.mailer import MailerHooks
from orquestador.notices.outbox import claim_due_emails
from orquestador.notices.smtp import DeliveryFailed, OutgoingEmail, SmtpTarget
from orquestador.notices.writing import message_id_for
from orquestador.worker.background import mailer as worker_mailer
from tests.integration.notice_support import (
    RECIPIENTS,
    SENDER,
    make_outbox_due,
    new_mailer,
    outbox,
    queue_email,
    running,
    sender_for,
    set_preferences,
)
from tests.integration.worker_support import wait_until
from tests.smtp_sink import (
    SmtpSink,
    free_port,
    running_sink,
    self_signed_certificate,
    trickling_server,
)


def _sent(engine) -> bool:
    return all(row.status == "sent" for row in outbox(engine))


def test_a_queued_email_is_delivered_once_with_the_message_id_of_its_key(runtime_engine):
    set_preferences(runtime_engine)
    key = "5b1c7e8a-0000-4000-8000-000000000001:notify"
    notice = queue_email(runtime_engine, key)
    with running_sink() as sink, running(new_mailer(runtime_engine, sink.url)):
        [received] = sink.wait_for(1)
        wait_until(lambda: _sent(runtime_engine), what="the row marked sent")

    assert received.message_id == message_id_for(key)
    assert received.message_id.endswith("@orquestador>") and len(received.message_id) == 78
    assert received.rcpt_tos == RECIPIENTS
    assert received.mail_from == "orquestador@example.com"
    assert received.message["From"] == SENDER
    assert received.message["Subject"].startswith("Disk almost full")
    assert "3% free" in received.message.get_content()
    [row] = outbox(runtime_engine)
    assert (row.notice_id, row.attempts, row.lease_owner, row.last_error) == (
        notice.notice_id,
        1,
        None,
        None,
    )
    assert row.sent_at is not None


def test_starttls_is_used_when_the_server_offers_it(runtime_engine, tmp_path):
    certificate, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(certificate, key)
    client_tls = ssl.create_default_context(cafile=str(certificate))
    set_preferences(runtime_engine)
    queue_email(runtime_engine)
    with running_sink(tls_context=server_tls) as sink:
        sender = sender_for(sink.url, ssl_context=client_tls)
        with running(new_mailer(runtime_engine, sink.url, sender=sender)):
            [received] = sink.wait_for(1)
            wait_until(lambda: _sent(runtime_engine), what="the row marked sent")

    assert received.tls


def test_two_mailers_at_once_never_deliver_the_same_row(runtime_engine):
    set_preferences(runtime_engine)
    for _ in range(20):
        queue_email(runtime_engine)
    # Both mailers hold a claim at the same moment before either delivers anything.
    both_claimed = threading.Barrier(2, timeout=20)
    first_claims: dict[str, int] = Counter()

    def hold_first(owner):
        def after_claim(email):
            first_claims[owner] += 1
            if first_claims[owner] == 1:
                both_claimed.wait()

        return MailerHooks(after_claim=after_claim)

    with running_sink() as sink:
        mailers = [
            new_mailer(runtime_engine, sink.url, owner, hooks=hold_first(owner))
            for owner in ("mailer-a", "mailer-b")
        ]
        with running(*mailers):
            sink.wait_for(20)
            wait_until(lambda: _sent(runtime_engine), what="every row marked sent")

    received = sink.received()
    assert len(received) == 20
    assert len({message.message_id for message in received}) == 20
    assert {row.attempts for row in outbox(runtime_engine)} == {1}
    assert set(first_claims) == {"mailer-a", "mailer-b"}
    assert sum(first_claims.values()) == 20


def test_smtp_down_backs_off_then_delivers_when_it_comes_back(runtime_engine):
    set_preferences(runtime_engine)
    queue_email(runtime_engine)
    sink = SmtpSink()  # its port, closed until started
    mailer = new_mailer(runtime_engine, sink.url, backoff=Backoff(base_seconds=0.5, cap_seconds=1))
    with running(mailer):
        first = wait_until(
            lambda: next((r for r in outbox(runtime_engine) if r.last_error), None),
            what="a refused try",
        )
        assert first.status == "pending" and first.lease_owner is None
        assert "ConnectionRefusedError" in first.last_error
        with runtime_engine.connect() as conn:
            later = conn.scalar(
                text("SELECT next_attempt_at > clock_timestamp() FROM email_outbox")
            )
        assert later, "the next try waits"
        wait_until(lambda: outbox(runtime_engine)[0].attempts >= 2, what="a second try")
        sink.start()
        try:
            sink.wait_for(1)
            wait_until(lambda: _sent(runtime_engine), what="the row marked sent")
        finally:
            sink.stop()

    [row] = outbox(runtime_engine)
    # At least one refused try before the one delivered: a try counts when it is taken, so
    # the second may be the one that finds the sink started.
    assert row.attempts >= 2 and row.last_error is None
    assert len(sink.received()) == 1


def test_after_the_bound_the_row_fails_with_a_safe_error_and_no_password(runtime_engine, caplog):
    set_preferences(runtime_engine)
    queue_email(runtime_engine)
    port = free_port()  # nobody listens
    url = f"smtps://mailer:pa55word-9z@127.0.0.1:{port}"
    mailer = new_mailer(runtime_engine, url, max_attempts=3, backoff=Backoff(0.05, 0.1))
    caplog.set_level(logging.DEBUG)
    with running(mailer):
        wait_until(lambda: outbox(runtime_engine)[0].status == "failed", what="given up")

    [row] = outbox(runtime_engine)
    assert row.attempts == 3
    assert "ConnectionRefusedError" in row.last_error
    assert "pa55word" not in row.last_error
    assert "pa55word" not in caplog.text
    assert "given up after 3 attempt(s)" in caplog.text


def test_a_permanent_refusal_fails_at_once(runtime_engine):
    set_preferences(runtime_engine, recipients=["nobody@invalid.example"])
    queue_email(runtime_engine)
    with running_sink() as sink:
        sink.refuse_recipients = True
        with running(new_mailer(runtime_engine, sink.url)):
            wait_until(lambda: outbox(runtime_engine)[0].status == "failed", what="failed")

    assert sink.received() == []

    [row] = outbox(runtime_engine)
    assert row.attempts == 1
    assert "550" in row.last_error


def test_an_expired_lease_is_claimed_again_and_a_live_one_is_not(runtime_engine):
    set_preferences(runtime_engine)
    queue_email(runtime_engine)
    with runtime_engine.connect() as conn:
        [first] = claim_due_emails(conn, "dead-mailer", lease_seconds=60)
        assert claim_due_emails(conn, "other", lease_seconds=60) == []
    make_outbox_due(runtime_engine)  # the lease runs out
    with runtime_engine.connect() as conn:
        [again] = claim_due_emails(conn, "other", lease_seconds=60)
    assert (again.id, again.message_id, again.attempt) == (first.id, first.message_id, 2)
    assert outbox(runtime_engine)[0].lease_owner == "other"


def test_without_smtp_url_no_mailer_runs_and_one_line_says_so(runtime_engine, caplog):
    caplog.set_level(logging.INFO, logger="orquestador.worker.background")
    assert worker_mailer(Settings.from_env({}), runtime_engine, "w1") is None
    [line] = [r.getMessage() for r in caplog.records if "SMTP_URL" in r.getMessage()]
    assert "queued e-mails wait" in line


@pytest.mark.parametrize(
    "url",
    ["http://mail.example.com", "smtp://", "smtp://mail.example.com:99999", "smtp://h/path"],
)
def test_an_unusable_smtp_url_is_refused_without_echoing_it(url):
    with pytest.raises(ConfigError) as refused:
        SmtpTarget.parse(url.replace("//", "//user:hunter2@", 1))
    assert "hunter2" not in str(refused.value)


def test_smtp_url_forms():
    plain = SmtpTarget.parse("smtp://mail.example.com")
    assert (plain.host, plain.port, plain.implicit_tls, plain.username) == (
        "mail.example.com",
        25,
        False,
        "",
    )
    secure = SmtpTarget.parse("smtps://me%40example.com:p%2Fss@mail.example.com:2465")
    assert (secure.port, secure.implicit_tls, secure.username, secure.password) == (
        2465,
        True,
        "me@example.com",
        "p/ss",
    )
    assert "p/ss" not in repr(secure) and secure.describe() == "smtps://mail.example.com:2465"


def test_a_server_that_trickles_cannot_hold_a_message_past_the_exchange_deadline():
    email = OutgoingEmail("<x@orquestador>", ["ops@example.com"], "Subject", "Body")
    with trickling_server(0.15) as port:
        patient = sender_for(f"smtp://127.0.0.1:{port}", timeout_seconds=1, delivery_seconds=10)
        started = time.monotonic()
        assert patient.send(email) == []  # every reply comes, only slowly
        whole_exchange = time.monotonic() - started
        hurried = sender_for(f"smtp://127.0.0.1:{port}", timeout_seconds=1, delivery_seconds=0.5)
        started = time.monotonic()
        with pytest.raises(DeliveryFailed) as failed:
            hurried.send(email)
    # The deadline ended the exchange before it could finish, however busy the machine.
    assert time.monotonic() - started < whole_exchange
    # Cut by the deadline: at a command's start, or in the middle of waiting for a reply.
    text = failed.value.safe_text
    assert ("deadline" in text or "timed out" in text) and not failed.value.permanent


def test_a_mailer_refuses_an_exchange_that_could_outlive_its_lease(runtime_engine):
    sender = sender_for("smtp://127.0.0.1:25", delivery_seconds=60)
    with pytest.raises(ValueError, match="lease"):
        new_mailer(runtime_engine, "", sender=sender, lease_seconds=60)


def test_a_bad_answer_to_quit_after_the_message_was_taken_is_still_a_delivery():
    email = OutgoingEmail("<x@orquestador>", ["ops@example.com"], "Subject", "Body")
    with trickling_server(0, quit_reply=b"554 what now") as port:
        assert sender_for(f"smtp://127.0.0.1:{port}").send(email) == []


def test_a_subject_or_body_of_any_script_arrives_as_written_on_one_line():
    title = "Máquina m-1 reinstalada ✓ \u2028 (line separator made a space)"
    body = "Olá,\nmundo ✓\n" + "y" * 2000
    with running_sink() as sink:
        sender_for(sink.url).send(OutgoingEmail("<u@orquestador>", RECIPIENTS, title, body))
        [received] = sink.wait_for(1)
    assert received.message["Subject"] == title.replace("\u2028", " ")
    # Lines travel as CRLF, as SMTP wants them.
    assert received.message.get_content().replace("\r\n", "\n").rstrip("\n") == body


def test_a_message_that_cannot_be_built_is_given_up_not_retried():
    sender = sender_for("smtp://127.0.0.1:9")  # never reached
    with pytest.raises(DeliveryFailed) as failed:
        sender.send(OutgoingEmail("<bad\n@orquestador>", RECIPIENTS, "Subject", "Body"))
    assert failed.value.permanent


def test_an_unforeseen_error_counts_as_a_failed_attempt_and_the_bound_holds(runtime_engine):
    set_preferences(runtime_engine)
    queue_email(runtime_engine)

    class Broken:
        delivery_seconds = 1.0

        def send(self, email):
            raise RuntimeError("something nobody planned for")

    mailer = new_mailer(
        runtime_engine, "", sender=Broken(), max_attempts=2, backoff=Backoff(0.05, 0.1)
    )
    with running(mailer):
        wait_until(lambda: outbox(runtime_engine)[0].status == "failed", what="given up")
    [row] = outbox(runtime_engine)
    assert (row.attempts, row.last_error) == (2, "unexpected RuntimeError")
    assert mailer.healthy.is_set()
