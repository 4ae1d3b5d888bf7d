"""Every e-mail outcome a notice can record has words a person reads beside it."""

from __future__ import annotations

from orquestador.notices.vocabulary import EmailOutcome, email_outcome_in_words


def test_every_outcome_reads_as_words_not_as_its_stored_name() -> None:
    for outcome in EmailOutcome:
        words = email_outcome_in_words(outcome.value)
        assert not words.startswith("e-mail:") and "_" not in words

    assert email_outcome_in_words("org_opted_out") == "no e-mail (the organization opted out)"
