"""notify@1: a panel notice keyed by the step's external key, and e-mail only when asked.

E-mail is opt-in on the node (`email`, default false) and still honours the
organization's opt-out of the `automation` category; the output and a NOTICE_WRITTEN
audit row say which it was. The e-mail itself is an `email_outbox` row written in the
notice's transaction; the worker's mailer delivers it. A dry run writes the notice
marked test and never an outbox row.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, select

from orquestador.actions.builtin.database import (
    BUILTIN_TIMEOUT_SECONDS,
    BuiltinDatabase,
    builtin_timeout_seconds,
)
from orquestador.actions.contracts import ActionContext, Adapter, Effect
from orquestador.actions.lookup import Found, LookupResult, NotFound
from orquestador.actions.registry import AdapterRegistry
from orquestador.config import Settings
from orquestador.db.request_machine import REQUEST_MACHINE
from orquestador.db.schema import flow, panel_notice, request
from orquestador.notices.preferences import email_decision
from orquestador.notices.vocabulary import CATEGORY_AUTOMATION, SEVERITIES, EmailOutcome
from orquestador.notices.writing import NoticeDraft, WrittenNotice, write_notice

MAX_TITLE_CHARACTERS = 200
MAX_BODY_CHARACTERS = 20_000

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        # The title becomes the e-mail's Subject: one line, so no control characters and
        # none of the line and paragraph separators a header cannot hold.
        "title": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_TITLE_CHARACTERS,
            "pattern": "^[^\\x00-\\x1f\\x7f\\x{85}\\x{2028}\\x{2029}]*$",
        },
        # PostgreSQL text cannot hold NUL; line breaks are welcome.
        "body": {"type": "string", "maxLength": MAX_BODY_CHARACTERS, "pattern": "^[^\\x00]*$"},
        "severity": {"enum": list(SEVERITIES)},
        # Filled by the engine from the node's own `"email": true` (the one switch); a
        # flow cannot map it (publish refuses an `email` input on notify).
        "email": {"type": "boolean"},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "noticeId": {"type": "string", "format": "uuid"},
        "email": {"enum": [outcome.value for outcome in EmailOutcome]},
    },
    "required": ["noticeId", "email"],
    "additionalProperties": False,
}

MAX_ATTEMPTS = 5


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _draft(ctx: ActionContext, email_footer: str = "") -> NoticeDraft:
    inputs = ctx.inputs
    return NoticeDraft(
        org_id=ctx.identity.org_id,
        external_key=ctx.external_key,
        title=inputs["title"],
        body=inputs["body"],
        severity=inputs.get("severity", "info"),
        category=CATEGORY_AUTOMATION,
        request_id=_uuid(ctx.identity.request_id),
        execution_id=_uuid(ctx.identity.execution_id),
        actor=ctx.identity.actor,
        email_footer=email_footer,
    )


def execution_page(public_base_url: str, execution_id: str) -> str:
    """The execution's page for people, under PUBLIC_BASE_URL."""
    return f"{public_base_url.rstrip('/')}/ui/executions/{execution_id}"


def _about(conn: Connection, ctx: ActionContext, public_base_url: str) -> str:
    """The e-mail's footer: the flow and machine it is about, and the execution's page.

    Read from the step's own request (in its organization): an e-mail read away from
    the panel has to say what it is about. The link only when PUBLIC_BASE_URL is set.
    """
    lines = []
    request_id = _uuid(ctx.identity.request_id)
    found = None
    if request_id is not None:
        found = conn.execute(
            # The request's machine as every reader reads it: its column, else its data's.
            select(flow.c.key, flow.c.version, REQUEST_MACHINE.label("machine_id"))
            .select_from(request.join(flow, flow.c.id == request.c.flow_id))
            .where(request.c.id == request_id, request.c.org_id == ctx.identity.org_id)
        ).one_or_none()
    if found is not None:
        lines.append(f"Flow: {found.key} (version {found.version})")
        if found.machine_id:
            lines.append(f"Machine: {found.machine_id}")
    if public_base_url and _uuid(ctx.identity.execution_id) is not None:
        lines.append(f"Execution: {execution_page(public_base_url, ctx.identity.execution_id)}")
    return "\n\n-- \n" + "\n".join(lines) + "\n" if lines else ""


def _email_words(outcome: EmailOutcome, recipients: list[str]) -> str:
    """What a real run would do about e-mail, for a dry run's summary."""
    if outcome is EmailOutcome.QUEUED:
        return f"would e-mail {len(recipients)} recipient{'s' if len(recipients) != 1 else ''}"
    return {
        EmailOutcome.OFF_ON_NODE: "no e-mail: the node's email is off",
        EmailOutcome.ORG_OPTED_OUT: "no e-mail: the organization opted out of automation e-mail",
        EmailOutcome.NO_RECIPIENTS: "no e-mail: the organization has no recipients",
    }.get(outcome, "no e-mail")


def _output(written: WrittenNotice) -> dict[str, Any]:
    return {"noticeId": str(written.notice_id), "email": written.email.value}


class Notify:
    """The adapter's calls, on the built-ins' lazily made database."""

    def __init__(self, database: BuiltinDatabase, public_base_url: str = "") -> None:
        self._database = database
        self._public_base_url = public_base_url

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        if ctx.simulation:
            # The engine calls simulate() in a dry run; should a simulated call ever
            # reach here, it still mails nobody.
            return self.simulate(ctx)
        email_requested = ctx.inputs.get("email", False)
        # Past the deadline another holder may own the step: nothing is written late.
        ctx.check_deadline("the notice")
        with self._database.engine.begin() as conn:
            footer = _about(conn, ctx, self._public_base_url) if email_requested else ""
            written = write_notice(conn, _draft(ctx, footer), email_requested=email_requested)
        ctx.observe({"noticeId": str(written.notice_id), "email": written.email.value})
        return _output(written)

    def simulate(self, ctx: ActionContext) -> dict[str, Any]:
        """A dry run's notice: written and marked test, never an outbox row.

        Its summary says whether the real run would e-mail it, by the same rule.
        """
        with self._database.engine.begin() as conn:
            if ctx.inputs.get("email", False):
                would, recipients = email_decision(conn, ctx.identity.org_id, CATEGORY_AUTOMATION)
            else:
                would, recipients = EmailOutcome.OFF_ON_NODE, []
            written = write_notice(conn, _draft(ctx), email_requested=False, test=True)
        summary = f"would notify: {ctx.inputs['title']}; {_email_words(would, recipients)}"
        ctx.observe({"summary": summary, "email": would.value, "recipients": recipients})
        return _output(written)

    def lookup(self, ctx: ActionContext) -> LookupResult:
        """Whether the notice of this step was written: its row is keyed by the external key."""
        with self._database.engine.connect() as conn:
            row = conn.execute(
                panel_notice.select()
                .with_only_columns(panel_notice.c.id, panel_notice.c.email)
                .where(
                    panel_notice.c.external_key == ctx.external_key,
                    panel_notice.c.org_id == ctx.identity.org_id,
                )
            ).one_or_none()
        if row is None:
            return NotFound()
        return Found({"noticeId": str(row.id), "email": row.email})


def notify_adapter(
    database: BuiltinDatabase,
    timeout_seconds: float = BUILTIN_TIMEOUT_SECONDS,
    public_base_url: str = "",
) -> Adapter:
    calls = Notify(database, public_base_url)
    return Adapter(
        capability="notify",
        version=1,
        effect=Effect.IDEMPOTENT_WRITE,
        input_schema=INPUT_SCHEMA,
        output_schema=OUTPUT_SCHEMA,
        # One short transaction; below any lease.
        timeout_seconds=timeout_seconds,
        max_attempts=MAX_ATTEMPTS,
        invoke=calls.invoke,
        simulate=calls.simulate,
        lookup=calls.lookup,
    )


def register(registry: AdapterRegistry, settings: Settings, database: BuiltinDatabase) -> None:
    registry.add(
        notify_adapter(
            database,
            builtin_timeout_seconds(settings.worker_lease_seconds),
            settings.public_base_url,
        )
    )
