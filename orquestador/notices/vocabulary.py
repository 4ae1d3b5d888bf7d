"""The words notices and their e-mail are described with, shared by writers, readers and docs."""

from __future__ import annotations

import enum

# The categories an organization may opt out of; every notice has one.
CATEGORY_AUTOMATION = "automation"
CATEGORIES: tuple[str, ...] = (CATEGORY_AUTOMATION,)

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")

# The only delivery channel so far; notification_opt_out is keyed by it.
CHANNEL_EMAIL = "email"


class EmailOutcome(enum.StrEnum):
    """What became of a notice's e-mail; recorded on the notice, in the output and the audit."""

    QUEUED = "queued"  # an email_outbox row was written with the notice
    OFF_ON_NODE = "off_on_node"  # the flow's node did not tick `email` (the default)
    ORG_OPTED_OUT = "org_opted_out"  # the organization opted out of the notice's category
    NO_RECIPIENTS = "no_recipients"  # the organization has configured nobody to send to
    SIMULATION = "simulation"  # a dry run: the notice is a test, nothing is sent
    # What a queued e-mail became once the mailer settled its outbox row (shown on the
    # notice; the notice row keeps `queued`, the NOTICE_EMAIL_SETTLED audit row says which).
    DELIVERED = "delivered"  # the SMTP server accepted it
    FAILED = "failed"  # refused for good, or given up after the mailer's last attempt


# The audit row that says why an e-mail was or was not sent.
AUDIT_NOTICE_WRITTEN = "NOTICE_WRITTEN"
# The audit row that says a queued e-mail was delivered or failed: {noticeId, email}.
AUDIT_NOTICE_EMAIL_SETTLED = "NOTICE_EMAIL_SETTLED"

# Each e-mail outcome as a person reads it beside a notice (pages, its history).
EMAIL_OUTCOME_WORDS: dict[str, str] = {
    EmailOutcome.QUEUED: "an e-mail is queued",
    EmailOutcome.DELIVERED: "its e-mail was delivered",
    EmailOutcome.FAILED: "its e-mail could not be delivered",
    EmailOutcome.OFF_ON_NODE: "no e-mail (the flow does not send one)",
    EmailOutcome.ORG_OPTED_OUT: "no e-mail (the organization opted out)",
    EmailOutcome.NO_RECIPIENTS: "no e-mail (the organization names nobody to send it to)",
    EmailOutcome.SIMULATION: "no e-mail (a dry run)",
}


def email_outcome_in_words(outcome: str | None) -> str:
    """What became of a notice's e-mail, in words; an outcome without words as it is."""
    return EMAIL_OUTCOME_WORDS.get(str(outcome), f"e-mail: {outcome}")
