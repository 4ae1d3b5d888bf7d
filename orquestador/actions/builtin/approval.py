"""approval@1: the step waits, WAITING and without a thread, until a person decides.

The first round writes the approval (keyed by the step's external key, so every later
round, retry or holder finds the same one, deadline included) and, when the node ticks
`email`, a notice e-mailed under the organization's rules. Each round then reads it: a
decision is the output, whatever the decision; an open approval past its deadline is
closed here, in a conditional update that a decision holding the row makes wait, and
the step fails APPROVAL_DEADLINE_EXCEEDED for the flow's error exit.

The step's one write is to this product's own database, keyed by its external key:
repeating it is as harmless as repeating a read, so it is declared READ_ONLY, the only
effect that may wait.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row

from orquestador.actions.builtin.database import BuiltinDatabase, builtin_timeout_seconds
from orquestador.actions.builtin.machine import FIRST_RECHECK_SECONDS, POLL_FALLBACK_SECONDS
from orquestador.actions.builtin.notify import execution_page
from orquestador.actions.contracts import ActionContext, Adapter, Effect
from orquestador.actions.errors import NotReady, PermanentError
from orquestador.actions.registry import AdapterRegistry
from orquestador.approvals.store import (
    DECISIONS,
    ApprovalDraft,
    close_at_deadline,
    decision_output,
    open_approval,
    wait_key,
)
from orquestador.approvals.subject import approval_subject
from orquestador.config import Settings
from orquestador.domain.statuses import ApprovalStatus
from orquestador.notices.preferences import email_decision
from orquestador.notices.vocabulary import CATEGORY_AUTOMATION, EmailOutcome
from orquestador.notices.writing import NoticeDraft, write_notice

CAPABILITY = "approval"
APPROVAL_DEADLINE_EXCEEDED = "APPROVAL_DEADLINE_EXCEEDED"
WORKER = "worker"
MAX_TITLE_CHARACTERS = 200
MAX_BODY_CHARACTERS = 20_000
MAX_SUBJECTS = 50
# A week: the longest any wait may last by default (WAIT_MAX_SECONDS).
MAX_DEADLINE_SECONDS = 604_800

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["title", "approvers", "deadlineSeconds"],
    "additionalProperties": False,
    "properties": {
        # One line: it is the notice's title and the e-mail's Subject.
        "title": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_TITLE_CHARACTERS,
            "pattern": "^[^\\x00-\\x1f\\x7f\\x{85}\\x{2028}\\x{2029}]*$",
        },
        "body": {"type": "string", "maxLength": MAX_BODY_CHARACTERS, "pattern": "^[^\\x00]*$"},
        # Who may decide: a listed `sub`, or a holder of `scope`; at least one of them.
        "approvers": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": False,
            "properties": {
                "scope": {"type": "string", "minLength": 1, "maxLength": 200},
                "subjects": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_SUBJECTS,
                    "items": {"type": "string", "minLength": 1, "maxLength": 200},
                },
            },
        },
        "deadlineSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS},
        # Filled by the engine from the node's own `"email": true`, as for notify.
        "email": {"type": "boolean"},
    },
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["approvalId", "decision", "by", "at", "comment"],
    "properties": {
        "approvalId": {"type": "string"},
        "decision": {"enum": list(DECISIONS)},
        "by": {"type": "string"},
        "at": {"type": "string"},
        "comment": {"type": "string"},
    },
}


def _draft(ctx: ActionContext) -> ApprovalDraft:
    inputs, identity = ctx.inputs, ctx.identity
    approvers = inputs["approvers"]
    return ApprovalDraft(
        org_id=identity.org_id,
        request_id=uuid.UUID(identity.request_id),
        execution_id=uuid.UUID(identity.execution_id),
        action_id=ctx.external_key.split(":", 1)[-1],  # "<executionId>:<actionId>"
        external_key=ctx.external_key,
        title=inputs["title"],
        body=inputs.get("body", ""),
        subjects=list(approvers.get("subjects", [])),
        scope=approvers.get("scope"),
        deadline_seconds=inputs["deadlineSeconds"],
        actor=identity.actor,
    )


def _who(approvers: dict[str, Any]) -> str:
    parts = []
    if approvers.get("subjects"):
        parts.append(", ".join(approvers["subjects"]))
    if approvers.get("scope"):
        parts.append(f"anyone holding {approvers['scope']}")
    return " or ".join(parts)


class Approvals:
    """The adapter's calls, on the built-ins' lazily made database."""

    def __init__(self, database: BuiltinDatabase, public_base_url: str = "") -> None:
        self._database = database
        self._public_base_url = public_base_url

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        # Past the deadline another holder may own the step: nothing is written late.
        ctx.check_deadline("the approval")
        with self._database.engine.begin() as conn:
            row, written = open_approval(conn, _draft(ctx))
            if written and ctx.inputs.get("email", False):
                self._mail(conn, ctx, row)
        if row.status == ApprovalStatus.OPEN and row.read_at >= row.deadline_at:
            with self._database.engine.begin() as conn:
                row = close_at_deadline(conn, row.id, WORKER)
        if row.status in DECISIONS:
            return decision_output(row)
        seen = {"approvalId": str(row.id), "status": row.status}
        if row.status == ApprovalStatus.EXPIRED:
            raise PermanentError(
                APPROVAL_DEADLINE_EXCEEDED,
                f"nobody decided before the deadline ({row.deadline_at.isoformat()})",
                observed=seen,
            )
        waited = (row.read_at - row.created_at).total_seconds()
        interval = min(POLL_FALLBACK_SECONDS, max(FIRST_RECHECK_SECONDS, waited))
        left = (row.deadline_at - row.read_at).total_seconds()
        # A decision wakes the execution at once by its key; the interval is the backstop,
        # and the deadline's moment is always one of the times it looks.
        raise NotReady(min(max(left, 0.001), interval), wait_key=wait_key(row.id), observed=seen)

    def _mail(self, conn: Connection, ctx: ActionContext, row: Row) -> None:
        page = ""
        if self._public_base_url:
            page = f"\n\nExecution: {execution_page(self._public_base_url, str(row.execution_id))}"
        subject = approval_subject(conn, org_id=row.org_id, execution_id=row.execution_id)
        about = "".join(f"{line}\n" for line in subject.lines()) if subject is not None else ""
        body = (
            (f"{row.body}\n\n" if row.body else "")
            + about
            + (
                f"Approvers: {_who(ctx.inputs['approvers'])}\n"
                f"Decide before {row.deadline_at.isoformat()}:\n"
                f"  orquestador approvals decide {row.id} approve|reject\n"
                f"  or POST /api/v1/approvals/{row.id}/decision{page}"
            )
        )
        draft = NoticeDraft(
            org_id=row.org_id,
            external_key=ctx.external_key,
            title=f"Approval needed: {row.title}",
            body=body,
            severity="warning",
            category=CATEGORY_AUTOMATION,
            request_id=row.request_id,
            execution_id=row.execution_id,
            actor=ctx.identity.actor,
        )
        written = write_notice(conn, draft, email_requested=True)
        ctx.observe({"approvalId": str(row.id), "email": written.email.value})

    def simulate(self, ctx: ActionContext) -> dict[str, Any]:
        """A dry run asks nobody: it says whom it would ask, and is approved."""
        words = f"would ask {_who(ctx.inputs['approvers'])} to approve: {ctx.inputs['title']}"
        would, recipients = EmailOutcome.OFF_ON_NODE, []
        if ctx.inputs.get("email", False):
            with self._database.engine.connect() as conn:
                would, recipients = email_decision(conn, ctx.identity.org_id, CATEGORY_AUTOMATION)
        if would is EmailOutcome.QUEUED:
            words += f"; would e-mail {', '.join(recipients)}"
        else:
            words += f"; no e-mail ({would.value})"
        ctx.observe(
            {
                "summary": words,
                "approvers": dict(ctx.inputs["approvers"]),
                "email": would.value,
                "recipients": recipients,
            }
        )
        now = datetime.now(UTC)
        return {
            "approvalId": str(uuid.uuid5(uuid.NAMESPACE_URL, ctx.external_key)),
            "decision": "approved",
            "by": "dry-run",
            "at": now.isoformat(),
            "comment": "",
        }


def register(registry: AdapterRegistry, settings: Settings, database: BuiltinDatabase) -> None:
    calls = Approvals(database, settings.public_base_url)
    registry.add(
        Adapter(
            capability=CAPABILITY,
            version=1,
            effect=Effect.READ_ONLY,
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            timeout_seconds=builtin_timeout_seconds(settings.worker_lease_seconds),
            max_attempts=3,
            invoke=calls.invoke,
            simulate=calls.simulate,
        )
    )
