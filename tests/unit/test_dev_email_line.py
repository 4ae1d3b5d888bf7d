"""The dev banner's e-mail line: whether notices' e-mails leave, never with credentials."""

from __future__ import annotations

from orquestador.config import Settings
from orquestador.dev import _email_said


def test_with_an_smtp_url_it_names_the_server_without_its_password() -> None:
    settings = Settings.from_env(
        {"SMTP_URL": "smtp://mailer:s3cret-pass@mail.example.com:587", "SMTP_FROM": "ops@x.io"}
    )

    said = _email_said(settings)

    assert said == "on, through smtp://mail.example.com:587 as ops@x.io"
    assert "s3cret" not in said


def test_without_one_it_says_how_to_turn_it_on() -> None:
    said = _email_said(Settings.from_env({}))

    assert said.startswith("off: e-mails wait in the outbox; set SMTP_URL")
    assert "docs/NOTICES.md" in said
