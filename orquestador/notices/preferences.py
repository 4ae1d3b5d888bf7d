"""An organization's notification preferences: opted-out categories and e-mail recipients.

E-mail is opt-in on the flow's node and opt-out per organization: a notice whose node
ticked `email` is still not mailed when its organization opted out of the category, or
named nobody to mail it to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from orquestador.db.schema import notification_opt_out, notification_preference
from orquestador.errors import Problem
from orquestador.notices.vocabulary import CATEGORIES, CHANNEL_EMAIL, EmailOutcome

MAX_RECIPIENTS = 20
MAX_ADDRESS_CHARACTERS = 254  # RFC 5321's limit on a forward path, less the brackets
MAX_LOCAL_PART_CHARACTERS = 64

# A plain addr-spec (RFC 5322 dot-atom local part, a DNS host name): no display names,
# quoted local parts, comments or address literals, so nothing in it can reshape a
# header or an SMTP command.
_LOCAL_PART = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_DOMAIN = re.compile(r"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}")


@dataclass(frozen=True)
class Preferences:
    org_id: str
    opt_out: list[str]
    recipients: list[str]
    updated_at: datetime | None

    def view(self) -> dict[str, Any]:
        return {
            "org": self.org_id,
            "optOut": self.opt_out,
            "recipients": self.recipients,
            "updatedAt": self.updated_at.isoformat() if self.updated_at else None,
        }


def address_problem(address: str) -> str | None:
    """Why `address` is not one this server mails to, or None."""
    if len(address) > MAX_ADDRESS_CHARACTERS:
        return f"an address is at most {MAX_ADDRESS_CHARACTERS} characters"
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return "an e-mail address such as ops@example.com"
    if len(local) > MAX_LOCAL_PART_CHARACTERS:
        return f"the part before @ is at most {MAX_LOCAL_PART_CHARACTERS} characters"
    if not _LOCAL_PART.fullmatch(local) or not _DOMAIN.fullmatch(domain):
        return "an e-mail address such as ops@example.com (no display name, no quotes)"
    return None


def preference_problems(opt_out: list[Any], recipients: list[Any]) -> list[Problem]:
    """Every unknown category and unusable address, at its JSON Pointer in the body."""
    problems = [
        Problem(f"/optOut/{index}", f"one of the categories {', '.join(CATEGORIES)}")
        for index, category in enumerate(opt_out)
        if category not in CATEGORIES
    ]
    for index, address in enumerate(recipients):
        reason = address_problem(address) if isinstance(address, str) else "a string"
        if reason:
            problems.append(Problem(f"/recipients/{index}", reason))
    if len(recipients) > MAX_RECIPIENTS:
        problems.append(Problem("/recipients", f"at most {MAX_RECIPIENTS} addresses"))
    return problems


def _unique(values: list[str], key: Any = None) -> list[str]:
    seen: set[str] = set()
    kept = []
    for value in values:
        marker = key(value) if key else value
        if marker not in seen:
            seen.add(marker)
            kept.append(value)
    return kept


def read_preferences(conn: Connection, org_id: str) -> Preferences:
    """The organization's preferences; nobody opted out and no recipients when never set."""
    opt_out = conn.scalars(
        select(notification_opt_out.c.category)
        .where(
            notification_opt_out.c.org_id == org_id,
            notification_opt_out.c.channel == CHANNEL_EMAIL,
        )
        .order_by(notification_opt_out.c.category)
    ).all()
    row = conn.execute(
        select(notification_preference.c.recipients, notification_preference.c.updated_at).where(
            notification_preference.c.org_id == org_id
        )
    ).one_or_none()
    return Preferences(
        org_id=org_id,
        opt_out=list(opt_out),
        recipients=list(row.recipients) if row else [],
        updated_at=row.updated_at if row else None,
    )


def save_preferences(
    conn: Connection, org_id: str, opt_out: list[str], recipients: list[str]
) -> Preferences:
    """Replace the organization's preferences (the caller holds the transaction)."""
    # Addresses differ only in case mostly by accident: the first spelling wins.
    recipients = _unique(recipients, key=str.lower)
    # The preference row first: its upsert locks it, so concurrent replacements of one
    # organization's preferences run one after the other, never interleaving opt-outs.
    upsert = pg_insert(notification_preference).values(org_id=org_id, recipients=recipients)
    conn.execute(
        upsert.on_conflict_do_update(
            index_elements=[notification_preference.c.org_id],
            set_={"recipients": upsert.excluded.recipients, "updated_at": func.now()},
        )
    )
    conn.execute(
        delete(notification_opt_out).where(
            notification_opt_out.c.org_id == org_id,
            notification_opt_out.c.channel == CHANNEL_EMAIL,
        )
    )
    for category in _unique(opt_out):
        conn.execute(
            pg_insert(notification_opt_out)
            .values(org_id=org_id, category=category, channel=CHANNEL_EMAIL)
            .on_conflict_do_nothing()
        )
    return read_preferences(conn, org_id)


def email_decision(conn: Connection, org_id: str, category: str) -> tuple[EmailOutcome, list[str]]:
    """Whether a notice whose node asked for e-mail is mailed, and to whom.

    The opt-out is checked first: an organization that opted out is told so even
    when it also has no recipients.
    """
    opted_out = conn.scalar(
        select(func.count())
        .select_from(notification_opt_out)
        .where(
            notification_opt_out.c.org_id == org_id,
            notification_opt_out.c.category == category,
            notification_opt_out.c.channel == CHANNEL_EMAIL,
        )
    )
    if opted_out:
        return EmailOutcome.ORG_OPTED_OUT, []
    recipients = conn.scalar(
        select(notification_preference.c.recipients).where(
            notification_preference.c.org_id == org_id
        )
    )
    if not recipients:
        return EmailOutcome.NO_RECIPIENTS, []
    return EmailOutcome.QUEUED, list(recipients)
