"""Every table of the product as SQLAlchemy Core, in its state after the newest migration.

The migrations under migrations/versions build this same schema step by step; a test
compares the two so neither drifts.
"""

from __future__ import annotations

import re

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from orquestador.db.sql_literals import quoted
from orquestador.domain.statuses import (
    ENDED_CHECKPOINT,
    FINAL_COMMAND,
    OPEN,
    UNHELD,
    ApprovalStatus,
    BulkAction,
    BulkItemOutcome,
    BulkStatus,
    CheckpointStatus,
    CommandStatus,
    ExecutionStatus,
    OutboxStatus,
    RolloutChildStatus,
    values,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Every JSONB column and parameter maps Python None to SQL NULL. SQLAlchemy's default
# turns None into the JSON value `null`: a nullable column would hold a "value", and
# `coalesce(:data, data)` would keep the null instead of the data.
JSONB_VALUE = JSONB(none_as_null=True)

TRIGGERS = ("manual", "webhook", "provisioned", "reinstalled", "deleted", "schedule")
# The trigger of flows a schedule starts (migration 0017).
SCHEDULE_TRIGGER = "schedule"
# What a schedule does with the fire times that passed while no worker fired them.
CATCH_UP_POLICIES = ("skip", "one", "all")
MOMENTS = ("provisioned", "reinstalled", "deleted")
EXECUTION_STATUSES = values(ExecutionStatus)
CHECKPOINT_STATUSES = values(CheckpointStatus)
# How an attempt ended; an attempt interrupted before anyone saw its end is recorded
# FAILED (a read) or UNKNOWN (a write) with error code INTERRUPTED.
ATTEMPT_STATUSES = tuple(s for s in CHECKPOINT_STATUSES if s in ENDED_CHECKPOINT)
# The safe message kept per attempt is at most this many characters.
ATTEMPT_MESSAGE_MAX = 1024
EFFECTS = ("READ_ONLY", "IDEMPOTENT_WRITE", "NON_IDEMPOTENT_WRITE")
COMMAND_STATUSES = values(CommandStatus)
FINAL_COMMAND_STATUSES = tuple(s for s in COMMAND_STATUSES if s in FINAL_COMMAND)
EMAIL_STATUSES = values(OutboxStatus)
# What became of a platform event: an execution started, or why none did.
EVENT_OUTCOMES = ("STARTED", "NO_BINDING", "REJECTED")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _uuid_pk() -> Column:
    return Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")
    )


def _created_at() -> Column:
    return Column(
        "created_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
    )


flow = Table(
    "flow",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("trigger", Text, nullable=False),
    Column("definition", JSONB_VALUE, nullable=False),
    Column("data_schema", JSONB_VALUE, nullable=False),
    Column("created_by", Text, nullable=False),
    _created_at(),
    UniqueConstraint("org_id", "key", "version"),
    # Target of plan_flow_binding's composite key: a binding names the trigger it expects.
    UniqueConstraint("id", "trigger"),
    CheckConstraint(_in("trigger", TRIGGERS), name="trigger"),
    CheckConstraint("version >= 1", name="version_positive"),
)

request = Table(
    "request",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("owner_id", Text, nullable=False),
    Column("flow_id", UUID(as_uuid=True), ForeignKey("flow.id"), nullable=False),
    Column("state", Text, nullable=False),
    Column("revision", Integer, nullable=False, server_default=text("1")),
    Column("data", JSONB_VALUE, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("acl", JSONB_VALUE, nullable=False, server_default=text("'[]'::jsonb")),
    Column("machine_id", Text),
    # A dry run's request: hidden from normal lists, purged after SIMULATION_RETENTION_DAYS.
    Column("simulation", Boolean, nullable=False, server_default=text("false")),
    Column(
        "busy_execution_id",
        UUID(as_uuid=True),
        ForeignKey("execution.id", use_alter=True),
    ),
    _created_at(),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Index(None, "org_id", "owner_id"),
    # Target of execution's composite key: an execution is simulated iff its request is.
    UniqueConstraint("id", "simulation"),
    # Room on each page for the updates of acceptances and finishes to stay on it (HOT:
    # no new index entries), however long after the insert (migration 0035).
    postgresql_with={"fillfactor": 90},
)

# An execution not ended (domain.statuses.OPEN), as the index and the quota's count say it.
OPEN_EXECUTION = f"status IN ({quoted(OPEN)})"
# An execution holds its concurrency key from its first claim until it ends.
KEY_HOLDING = f"started_at IS NOT NULL AND {OPEN_EXECUTION}"
# What the claim may take once it is due (ix_execution_ready, ix_execution_due).
_UNHELD_READY = f"status IN ({quoted(UNHELD)}) AND NOT key_blocked"

execution = Table(
    "execution",
    metadata,
    _uuid_pk(),
    Column("request_id", UUID(as_uuid=True), ForeignKey("request.id"), nullable=False),
    Column("org_id", Text, nullable=False),
    Column("flow_id", UUID(as_uuid=True), ForeignKey("flow.id"), nullable=False),
    Column("transition_id", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text(f"'{ExecutionStatus.PENDING}'")),
    Column("accepted_revision", Integer, nullable=False),
    Column("accepted_state", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("10")),
    Column("fencing_token", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_owner", Text),
    Column("lease_expires_at", TIMESTAMP(timezone=True)),
    Column(
        "next_attempt_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
    ),
    Column("simulation", Boolean, nullable=False, server_default=text("false")),
    Column("actor_snapshot", JSONB_VALUE, nullable=False),
    Column("result", JSONB_VALUE),
    Column("error_code", Text),
    # Where the failure was (action, pointer, schema paths): never values.
    Column("error_detail", JSONB_VALUE),
    # What a WAITING execution waits for ("machine_command:<id>"): a change to it sets
    # next_attempt_at to now and notifies, so the wait ends at once.
    Column("wait_key", Text),
    # 0-9: within an organization the claim takes higher first (migration 0015).
    Column("priority", SmallInteger, nullable=False, server_default=text("5")),
    # The value a transition's `concurrency.key` read at acceptance, and its limit. Held
    # from the first claim (started_at set) until the execution ends: KEY_HOLDING.
    Column("concurrency_key", Text),
    Column("concurrency_limit", Integer),
    # PENDING, and its key was full when the claim last looked: out of the claim's index
    # until a holder ends and a claim lets it back (key_release).
    Column("key_blocked", Boolean, nullable=False, server_default=text("false")),
    # A dry run's `outcomes`: what its steps answer instead of being simulated (migration
    # 0020); written with the execution, never changed, never on a real run.
    Column("rehearsal", JSONB_VALUE),
    # The W3C traceparent of the acceptance (migration 0025): the worker's spans continue
    # its trace. NULL when tracing was off.
    Column("trace_parent", Text),
    # The execution whose finish continued into this one (the flow's `"continue"`,
    # migration 0030), and how many continuations in a row without a person led here.
    Column("continued_from", UUID(as_uuid=True)),
    Column("continuations", Integer, nullable=False, server_default=text("0")),
    # The rollout step's execution that started this one as a child (rollout@1,
    # migration 0031); NULL for every other execution.
    Column("parent_execution_id", UUID(as_uuid=True)),
    # A cancel a person asked for while a step's call was in flight (migration 0034):
    # when, who and why. Its holder applies it once the call returns; an operator's
    # retry of a parked execution clears it.
    Column("cancel_requested_at", TIMESTAMP(timezone=True)),
    Column("cancel_requested_by", Text),
    Column("cancel_requested_reason", Text),
    Column(
        "created_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    Column("started_at", TIMESTAMP(timezone=True)),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Column("finished_at", TIMESTAMP(timezone=True)),
    CheckConstraint(_in("status", EXECUTION_STATUSES), name="status"),
    # A real execution on a dry run's request (or the reverse) cannot exist, whoever
    # writes it: the API, the platform consumer, a dry run or a hand-written INSERT.
    ForeignKeyConstraint(["request_id", "simulation"], ["request.id", "request.simulation"]),
    # Only RUNNING rows carry a lease; claims and renewals rely on it.
    CheckConstraint(
        f"(status = '{ExecutionStatus.RUNNING}')"
        " = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="lease_iff_running",
    ),
    CheckConstraint("priority BETWEEN 0 AND 9", name="priority"),
    CheckConstraint("rehearsal IS NULL OR simulation", name="rehearsal_in_dry_runs_only"),
    CheckConstraint(
        "(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit >= 1",
        name="concurrency",
    ),
    # The claim: one organization at a time, one priority at a time, oldest due first.
    Index(
        "ix_execution_ready",
        "org_id",
        "priority",
        "next_attempt_at",
        "id",
        postgresql_where=text(_UNHELD_READY),
    ),
    Index(
        "ix_execution_key_holders",
        "org_id",
        "concurrency_key",
        postgresql_where=text(f"concurrency_key IS NOT NULL AND {KEY_HOLDING}"),
    ),
    Index(
        "ix_execution_key_blocked",
        "org_id",
        "concurrency_key",
        "priority",
        "created_at",
        "id",
        postgresql_where=text(f"key_blocked AND status = '{ExecutionStatus.PENDING}'"),
    ),
    # Due work in due order: the gauge of the oldest due execution.
    Index(
        "ix_execution_due",
        "next_attempt_at",
        "created_at",
        "id",
        postgresql_where=text(_UNHELD_READY),
    ),
    Index(
        "ix_execution_wait_key",
        "wait_key",
        postgresql_where=text(f"status = '{ExecutionStatus.WAITING}'"),
    ),
    Index(
        "ix_execution_lease",
        "lease_expires_at",
        postgresql_where=text(f"status = '{ExecutionStatus.RUNNING}'"),
    ),
    # The reconciliation queue and its gauge (the maintenance loop counts it every pass).
    Index(
        "ix_execution_reconciliation",
        "created_at",
        postgresql_where=text(f"status = '{ExecutionStatus.RECONCILIATION_REQUIRED}'"),
    ),
    # A finish continues into one execution at most; and the view finds it by this.
    Index(
        "ux_execution_continued_from",
        "continued_from",
        unique=True,
        postgresql_where=text("continued_from IS NOT NULL"),
    ),
    Index(None, "request_id"),
    # A rollout's children, for its page and `executions list --parent`.
    Index(
        "ix_execution_parent",
        "parent_execution_id",
        "created_at",
        postgresql_where=text("parent_execution_id IS NOT NULL"),
    ),
    # GET /executions: one organization's executions, newest first, by keyset.
    Index("ix_execution_listing", "org_id", "created_at", "id"),
    # The quota openExecutions: an organization's executions not ended, counted at each
    # acceptance from this index alone.
    Index("ix_execution_open", "org_id", postgresql_where=text(OPEN_EXECUTION)),
)

action_execution = Table(
    "action_execution",
    metadata,
    Column("execution_id", UUID(as_uuid=True), ForeignKey("execution.id"), nullable=False),
    Column("action_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("input_hash", Text, nullable=False),
    Column("external_key", Text, nullable=False),
    Column("effect", Text, nullable=False),
    Column("capability", Text, nullable=False),
    Column("adapter_version", Integer, nullable=False),
    Column("output", JSONB_VALUE),
    Column("error_code", Text),
    # An operator's approved retry restarts the attempt budget after this attempt.
    Column("attempt_base", Integer, nullable=False, server_default=text("0")),
    # When the step first started; kept by every later attempt, wait and reclaim.
    Column("first_started_at", TIMESTAMP(timezone=True)),
    # What the step saw of the world (ActionContext.observe): frozen into the audit.
    Column("observed", JSONB_VALUE),
    Column(
        "started_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    Column("finished_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("execution_id", "action_id"),
    UniqueConstraint("external_key"),
    CheckConstraint(_in("status", CHECKPOINT_STATUSES), name="status"),
    CheckConstraint(_in("effect", EFFECTS), name="effect"),
)

# One row per ended attempt of an action, never updated: the checkpoint keeps only the
# latest attempt, and the write rule must still see an earlier attempt whose write may
# have happened. Written in the same statement as the checkpoint's own change.
# Partitioned by month of started_at (migration 0024): the key must be in the primary
# key, and an attempt's every line carries its checkpoint's start, so (execution,
# action, attempt) stays unique as before.
action_attempt = Table(
    "action_attempt",
    metadata,
    Column("execution_id", UUID(as_uuid=True), nullable=False),
    Column("action_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("status", Text, nullable=False),
    Column("error_code", Text),
    Column("message", Text),
    Column("started_at", TIMESTAMP(timezone=True), nullable=False),
    # NULL when the attempt was interrupted: nobody saw it end.
    Column("finished_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("execution_id", "action_id", "attempt", "started_at"),
    ForeignKeyConstraint(
        ["execution_id", "action_id"],
        ["action_execution.execution_id", "action_execution.action_id"],
    ),
    CheckConstraint(_in("status", ATTEMPT_STATUSES), name="status"),
    CheckConstraint(f"length(message) <= {ATTEMPT_MESSAGE_MAX}", name="message_length"),
    postgresql_partition_by="RANGE (started_at)",
)

# Partitioned by month of created_at (migration 0024); the id stays the order of events.
audit_event = Table(
    "audit_event",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("org_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("request_id", UUID(as_uuid=True)),
    Column("execution_id", UUID(as_uuid=True)),
    Column("actor", Text),
    Column("detail", JSONB_VALUE, nullable=False, server_default=text("'{}'::jsonb")),
    Column(
        "created_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
        primary_key=True,
    ),
    Index(None, "execution_id"),
    Index(None, "request_id"),
    postgresql_partition_by="RANGE (created_at)",
)

machine_command = Table(
    "machine_command",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("machine_id", Text, nullable=False),
    Column("command", Text, nullable=False),
    Column("args", JSONB_VALUE, nullable=False, server_default=text("'[]'::jsonb")),
    Column("status", Text, nullable=False, server_default=text(f"'{CommandStatus.PENDING}'")),
    Column("external_key", Text, nullable=False),
    Column("result", JSONB_VALUE),
    Column("exit_code", Integer),
    # The output's head (migration 0027: its tail, and how far the agent's chunks and the
    # kept bytes go; machines/output.py).
    Column("output", Text),
    Column("output_tail", Text),
    Column("output_received", BigInteger, nullable=False, server_default=text("0")),
    Column("output_size", BigInteger, nullable=False, server_default=text("0")),
    Column("simulation", Boolean, nullable=False, server_default=text("false")),
    _created_at(),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Column("sent_at", TIMESTAMP(timezone=True)),
    Column("finished_at", TIMESTAMP(timezone=True)),
    # A cancel asked the agent to stop a command it had already taken (sent or running).
    Column("cancel_requested_at", TIMESTAMP(timezone=True)),
    # No agent is handed the command after this instant (migration 0027): the deadline of
    # the wait that waits for it, else COMMAND_DELIVERY_SECONDS after it was written. The
    # default serves rows written without it (commands from before the column).
    Column(
        "deliver_by",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("(clock_timestamp() + '00:15:00'::interval)"),
    ),
    UniqueConstraint("external_key"),
    CheckConstraint(_in("status", COMMAND_STATUSES), name="status"),
    Index(None, "org_id", "machine_id", "status"),
    # Retention deletes final commands by age.
    Index(
        "ix_machine_command_finished",
        "finished_at",
        postgresql_where=text(f"{_in('status', FINAL_COMMAND_STATUSES)}"),
    ),
    # The maintenance pass expires pending commands whose deliver-by time passed.
    Index(
        "ix_machine_command_undelivered",
        "deliver_by",
        postgresql_where=text(f"status = '{CommandStatus.PENDING}'"),
    ),
)

# When each machine's agent was last seen (migration 0027): written by its polls and
# reports, at most once per machine per 10 seconds; online or offline is worked out when
# read, against AGENT_OFFLINE_SECONDS, so no job ever flips it.
machine_agent = Table(
    "machine_agent",
    metadata,
    Column("org_id", Text, nullable=False),
    Column("machine_id", Text, nullable=False),
    Column("last_seen_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("org_id", "machine_id"),
    # The gauge of offline agents counts those last seen before a moment.
    Index(None, "last_seen_at"),
)

# Commands change status: a WAITING execution whose wait_key names the command wakes.
COMMAND_CHANGED_CHANNEL = "orquestador_command_changed"

hosting_plan = Table(
    "hosting_plan",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    # The platform's own id for the plan (PUT /plans/{planId}, events' planId).
    Column("key", Text, nullable=False),
    Column("name", Text, nullable=False),
    _created_at(),
    UniqueConstraint("org_id", "key"),
)

plan_flow_binding = Table(
    "plan_flow_binding",
    metadata,
    Column(
        "plan_id",
        UUID(as_uuid=True),
        ForeignKey("hosting_plan.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("moment", Text, nullable=False),
    Column("flow_id", UUID(as_uuid=True), nullable=False),
    PrimaryKeyConstraint("plan_id", "moment"),
    CheckConstraint(_in("moment", MOMENTS), name="moment"),
    # The bound flow's own trigger must be this moment: the schema, not care, enforces it.
    ForeignKeyConstraint(["flow_id", "moment"], ["flow.id", "flow.trigger"]),
)

panel_notice = Table(
    "panel_notice",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("request_id", UUID(as_uuid=True)),
    Column("execution_id", UUID(as_uuid=True)),
    Column("external_key", Text, nullable=False),
    Column("test", Boolean, nullable=False, server_default=text("false")),
    Column("severity", Text, nullable=False, server_default=text("'info'")),
    # What became of the e-mail: queued, off_on_node, org_opted_out or simulation.
    Column("email", Text, nullable=False, server_default=text("'off_on_node'")),
    _created_at(),
    Column("read_at", TIMESTAMP(timezone=True)),
    Column("dismissed_at", TIMESTAMP(timezone=True)),
    Column("dismissed_by", Text),
    UniqueConstraint("external_key"),
    Index(None, "org_id", "created_at"),
)

# Who receives an organization's e-mails; opt-outs stay in notification_opt_out.
notification_preference = Table(
    "notification_preference",
    metadata,
    Column("org_id", Text, primary_key=True),
    Column("recipients", JSONB_VALUE, nullable=False, server_default=text("'[]'::jsonb")),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
)

# E-mails to deliver, written in the same transaction as their notice; the mailer claims
# rows with SKIP LOCKED and a lease so each is delivered by one worker at a time.
email_outbox = Table(
    "email_outbox",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("notice_id", UUID(as_uuid=True), ForeignKey("panel_notice.id", ondelete="CASCADE")),
    # Derived from the notice's external key: a redelivery carries the same Message-ID.
    Column("message_id", Text, nullable=False),
    Column("recipients", JSONB_VALUE, nullable=False),
    Column("subject", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text(f"'{OutboxStatus.PENDING}'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column(
        "next_attempt_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
    ),
    Column("lease_owner", Text),
    Column("lease_expires_at", TIMESTAMP(timezone=True)),
    Column("last_error", Text),
    # The traceparent of the step that queued it (migration 0025); the delivery's span
    # continues that trace.
    Column("trace_parent", Text),
    _created_at(),
    Column("sent_at", TIMESTAMP(timezone=True)),
    UniqueConstraint("message_id"),
    CheckConstraint(_in("status", EMAIL_STATUSES), name="status"),
    Index(
        "ix_email_outbox_due",
        "next_attempt_at",
        postgresql_where=text(f"status = '{OutboxStatus.PENDING}'"),
    ),
)

# Platform events: POST /events writes here, and the platform may insert here itself
# inside its own transaction (a transactional outbox; the platform role may only
# insert). The sender's id, per organization, makes each event start at most once.
platform_event = Table(
    "platform_event",
    metadata,
    Column("org_id", Text, nullable=False),
    Column("id", Text, nullable=False),
    Column("moment", Text, nullable=False),
    Column("plan_id", Text, nullable=False),
    Column("machine_id", Text, nullable=False),
    Column("occurred_at", TIMESTAMP(timezone=True)),
    Column("data", JSONB_VALUE, nullable=False, server_default=text("'{}'::jsonb")),
    Column(
        "received_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    Column("processed_at", TIMESTAMP(timezone=True)),
    Column("outcome", Text),
    Column("request_id", UUID(as_uuid=True)),
    Column("execution_id", UUID(as_uuid=True)),
    PrimaryKeyConstraint("org_id", "id"),
    CheckConstraint(_in("moment", MOMENTS), name="moment"),
    CheckConstraint(f"outcome IS NULL OR {_in('outcome', EVENT_OUTCOMES)}", name="outcome"),
    Index(
        "ix_platform_event_unprocessed",
        "received_at",
        postgresql_where=text("processed_at IS NULL"),
    ),
)

notification_opt_out = Table(
    "notification_opt_out",
    metadata,
    Column("org_id", Text, nullable=False),
    Column("category", Text, nullable=False),
    Column("channel", Text, nullable=False, server_default=text("'email'")),
    PrimaryKeyConstraint("org_id", "category", "channel"),
)

# Machine agents' enrolled tokens, by their `jti` (never the token): the API refuses a
# revoked one from the next request on. Created by an operator as the owner role; the
# runtime role reads them and may only revoke.
machine_credential = Table(
    "machine_credential",
    metadata,
    Column("id", Text, primary_key=True),
    Column("org_id", Text, nullable=False),
    Column("machine_id", Text, nullable=False),
    Column("issued_at", TIMESTAMP(timezone=True), nullable=False),
    Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
    Column("issued_by", Text, nullable=False),
    Column("revoked_at", TIMESTAMP(timezone=True)),
    Column("revoked_by", Text),
    CheckConstraint("expires_at > issued_at", name="lifetime"),
    CheckConstraint("(revoked_at IS NULL) = (revoked_by IS NULL)", name="revoked_by_whom"),
    Index(None, "org_id", "machine_id"),
)

# Tokens signed out of the pages, by SHA-256, until they expire (api/page_sessions.py).
page_session_revocation = Table(
    "page_session_revocation",
    metadata,
    Column("token_sha256", Text, primary_key=True),
    Column("org_id", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
    Column(
        "revoked_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    Index(None, "expires_at"),
)

# A concurrency key a holder let go of (migration 0015's trigger writes the row in the
# holder's ending transaction); the next claim takes it and, under the key's lock, lets
# the oldest executions blocked on the key back (queue/claims.py).
key_release = Table(
    "key_release",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("org_id", Text, nullable=False),
    Column("concurrency_key", Text, nullable=False),
)

# A rate-limited route's token bucket (migration 0016), shared by every worker: a call
# takes a token in one upsert that refills the bucket for the time since `refilled_at`
# (queue/rate_limits.py). The route's rate and burst are configuration, not stored.
rate_bucket = Table(
    "rate_bucket",
    metadata,
    Column("name", Text, primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", TIMESTAMP(timezone=True), nullable=False),
)

# A person's decision a step waits for (approval@1, migration 0019): written by the step's
# first round, keyed by its external key; decided once through the API, or closed by the
# step when its deadline passes. Both are conditional updates of the open row, so exactly
# one of them wins.
APPROVAL_STATUSES = values(ApprovalStatus)
approval = Table(
    "approval",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("request_id", UUID(as_uuid=True), nullable=False),
    Column("execution_id", UUID(as_uuid=True), nullable=False),
    Column("action_id", Text, nullable=False),
    Column("external_key", Text, nullable=False),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False, server_default=text("''")),
    # Who may decide: a listed `sub`, or a holder of the scope (either suffices).
    Column("approver_subjects", JSONB_VALUE, nullable=False, server_default=text("'[]'::jsonb")),
    Column("approver_scope", Text),
    # Who may never decide: whoever asked for the transition and the request's owner.
    Column("requesters", JSONB_VALUE, nullable=False, server_default=text("'[]'::jsonb")),
    Column("deadline_at", TIMESTAMP(timezone=True), nullable=False),
    Column("status", Text, nullable=False, server_default=text(f"'{ApprovalStatus.OPEN}'")),
    Column("decided_by", Text),
    Column("decided_at", TIMESTAMP(timezone=True)),
    Column("comment", Text),
    _created_at(),
    UniqueConstraint("external_key"),
    CheckConstraint(_in("status", values(ApprovalStatus)), name="status"),
    CheckConstraint(f"(status = '{ApprovalStatus.OPEN}') = (decided_at IS NULL)", name="decided"),
    Index(None, "org_id", "status", "created_at", "id"),
)

# A schedule (migration 0017): the caller's id per organization, the flow it starts,
# when (a five-field cron in a time zone, or every N seconds) and what it does after
# downtime. `next_fire_at` is the next fire time not yet handled, NULL while paused.
# Since migration 0027 any flow: by key (`flow_key`, each fire its latest version;
# `flow_id` the version it was put with) or by version (`flow_id` alone), and the
# transition each fire accepts (`transition_id`; NULL: the flow's `start`).
schedule = Table(
    "schedule",
    metadata,
    Column("org_id", Text, nullable=False),
    Column("id", Text, nullable=False),
    Column("flow_id", UUID(as_uuid=True), nullable=False),
    # The trigger of the flow version it was put with (no longer bound to `schedule`).
    Column("flow_trigger", Text, nullable=False, server_default=text("'schedule'")),
    Column("flow_key", Text),
    Column("transition_id", Text),
    Column("cron", Text),
    Column("every_seconds", Integer),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("data", JSONB_VALUE, nullable=False, server_default=text("'{}'::jsonb")),
    Column("catch_up", Text, nullable=False, server_default=text("'skip'")),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("next_fire_at", TIMESTAMP(timezone=True)),
    Column("last_fired_at", TIMESTAMP(timezone=True)),
    # Fire times that passed without an execution (the catch-up policy let them go).
    Column("missed", BigInteger, nullable=False, server_default=text("0")),
    # After a round failed on this schedule in a way of its own, no round takes it before
    # this instant (its fire times stay as they are; the others go on meanwhile).
    Column("retry_at", TIMESTAMP(timezone=True)),
    # Whose requests the fires start: whoever put the schedule last.
    Column("updated_by", Text, nullable=False),
    _created_at(),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("org_id", "id"),
    ForeignKeyConstraint(["flow_id"], ["flow.id"]),
    CheckConstraint("num_nonnulls(cron, every_seconds) = 1", name="cron_or_every"),
    CheckConstraint("every_seconds >= 1", name="every_seconds_positive"),
    CheckConstraint(_in("catch_up", CATCH_UP_POLICIES), name="catch_up"),
    CheckConstraint("missed >= 0", name="missed_not_negative"),
    # The firing loop's index: schedules that are due, soonest first.
    Index(
        "ix_schedule_due",
        "next_fire_at",
        postgresql_where=text("NOT paused AND next_fire_at IS NOT NULL"),
    ),
)

# One row per fire time a schedule handled: its key is what makes a fire time start at
# most one execution, whatever the number of workers. request_id and execution_id are
# NULL when the fire was refused (its audit row says why).
schedule_fire = Table(
    "schedule_fire",
    metadata,
    Column("org_id", Text, nullable=False),
    Column("schedule_id", Text, nullable=False),
    Column("fire_time", TIMESTAMP(timezone=True), nullable=False),
    Column("request_id", UUID(as_uuid=True)),
    Column("execution_id", UUID(as_uuid=True)),
    Column(
        "fired_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    PrimaryKeyConstraint("org_id", "schedule_id", "fire_time"),
    ForeignKeyConstraint(
        ["org_id", "schedule_id"], ["schedule.org_id", "schedule.id"], ondelete="CASCADE"
    ),
    # Retention: fire rows older than SCHEDULE_FIRE_RETENTION_DAYS, oldest first.
    Index("ix_schedule_fire_fired_at", "fired_at"),
)

SCHEDULE_UPDATE_COLUMNS = (
    "flow_id",
    "flow_key",
    "flow_trigger",
    "transition_id",
    "cron",
    "every_seconds",
    "timezone",
    "data",
    "catch_up",
    "paused",
    "next_fire_at",
    "last_fired_at",
    "missed",
    "retry_at",
    "updated_by",
    "updated_at",
)

# Bulk actions by query (migration 0018): an operator's cancel, retry or fail of every
# execution a filter matched. The items are fixed when the bulk is accepted; the worker
# acts on each in a transaction of its own that records the item's outcome, so a resumed
# bulk never acts on an item twice (queue/bulk.py).
BULK_ACTIONS = values(BulkAction)
BULK_STATUSES = values(BulkStatus)
BULK_ITEM_OUTCOMES = values(BulkItemOutcome)

bulk_action = Table(
    "bulk_action",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("reason", Text, nullable=False),
    # The filter as the operator sent it: what the items were chosen by.
    Column("filter", JSONB_VALUE, nullable=False),
    Column("status", Text, nullable=False, server_default=text(f"'{BulkStatus.RUNNING}'")),
    Column("total", Integer, nullable=False),
    Column(
        "created_at",
        TIMESTAMP(timezone=True),
        nullable=False,
        server_default=text("clock_timestamp()"),
    ),
    Column("finished_at", TIMESTAMP(timezone=True)),
    CheckConstraint(_in("action", BULK_ACTIONS), name="action"),
    CheckConstraint(_in("status", BULK_STATUSES), name="status"),
    CheckConstraint(
        f"(status = '{BulkStatus.DONE}') = (finished_at IS NOT NULL)", name="finished_iff_done"
    ),
    # The worker's look for work: the running bulks, oldest first.
    Index(
        "ix_bulk_action_running",
        "created_at",
        postgresql_where=text(f"status = '{BulkStatus.RUNNING}'"),
    ),
)

bulk_item = Table(
    "bulk_item",
    metadata,
    Column("bulk_id", UUID(as_uuid=True), ForeignKey("bulk_action.id"), nullable=False),
    Column("execution_id", UUID(as_uuid=True), ForeignKey("execution.id"), nullable=False),
    Column("outcome", Text),
    # The problem code of a refused or parked item; the refusal's words beside it.
    Column("code", Text),
    Column("detail", Text),
    Column("finished_at", TIMESTAMP(timezone=True)),
    # The execution's updated_at when the bulk was accepted (migration 0032): a decision
    # item whose execution changed since is refused STALE_ITEM.
    Column("seen_updated_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("bulk_id", "execution_id"),
    CheckConstraint(f"outcome IS NULL OR {_in('outcome', BULK_ITEM_OUTCOMES)}", name="outcome"),
    CheckConstraint("(outcome IS NULL) = (finished_at IS NULL)", name="finished_iff_outcome"),
    CheckConstraint(
        f"(outcome = '{BulkItemOutcome.SUCCEEDED}') = (code IS NULL)", name="code_unless_succeeded"
    ),
    # The items nobody has acted on yet, in the order the worker takes them.
    Index(
        "ix_bulk_item_pending",
        "bulk_id",
        "execution_id",
        postgresql_where=text("outcome IS NULL"),
    ),
    Index(None, "execution_id"),
)

ROLLOUT_CHILD_STORED = tuple(
    s for s in values(RolloutChildStatus) if s != RolloutChildStatus.SKIPPED
)

# A rollout step (rollout@1, migration 0031): one operation across many machines. Written
# by the step's first round, keyed by its external key (every later round, retry or holder
# finds it), with the items frozen and the child flow's version pinned. The counters are
# the children's statuses as the rollout counts them: `running` moves up when a child
# starts (under this row's lock, with the budget checked in the same statement) and every
# child's end moves its count under the same lock (the trigger orquestador_rollout_child_ended),
# so a start and an end never miss each other.
rollout = Table(
    "rollout",
    metadata,
    _uuid_pk(),
    Column("org_id", Text, nullable=False),
    Column("request_id", UUID(as_uuid=True), nullable=False),
    Column("execution_id", UUID(as_uuid=True), nullable=False),
    Column("action_id", Text, nullable=False),
    Column("external_key", Text, nullable=False),
    # The child flow's version, the key's latest when the step first ran.
    Column("flow_id", UUID(as_uuid=True), nullable=False),
    Column("transition_id", Text, nullable=False),
    Column("items", JSONB_VALUE, nullable=False),
    Column("data", JSONB_VALUE, nullable=False),
    Column("total", Integer, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("max_failures", Integer, nullable=False),
    Column("pause_between_seconds", Float, nullable=False, server_default=text("0")),
    # Whom the children act for and how urgent they are: the parent's.
    Column("actor_snapshot", JSONB_VALUE, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    # The rollout whose failed children this one starts again ("retry the failed").
    Column("retry_of", UUID(as_uuid=True)),
    # The next item to start; items before it have a child (or a refusal).
    Column("next_index", Integer, nullable=False, server_default=text("0")),
    Column("running", Integer, nullable=False, server_default=text("0")),
    Column("succeeded", Integer, nullable=False, server_default=text("0")),
    Column("failed", Integer, nullable=False, server_default=text("0")),
    Column("cancelled", Integer, nullable=False, server_default=text("0")),
    Column("next_start_at", TIMESTAMP(timezone=True)),
    Column("paused_at", TIMESTAMP(timezone=True)),
    Column("paused_by", Text),
    Column("cancelled_at", TIMESTAMP(timezone=True)),
    Column("cancelled_by", Text),
    # The last change a waiting parent must see (a child's end, a pause, a resume, a
    # cancel): a first round whose key is not on its row yet compares it with its claim.
    # NULL until the first such change.
    Column("changed_at", TIMESTAMP(timezone=True)),
    _created_at(),
    UniqueConstraint("external_key"),
    CheckConstraint("batch >= 1 AND max_failures >= 0 AND total >= 0", name="limits"),
    CheckConstraint("next_index BETWEEN 0 AND total", name="next_index"),
    CheckConstraint(
        "running >= 0 AND succeeded >= 0 AND failed >= 0 AND cancelled >= 0", name="counts"
    ),
    Index(None, "execution_id"),
)

# One row per started item of a rollout: the primary key (rollout, item index) is what
# makes an item start at most one child, whatever crashes or holders there are.
rollout_child = Table(
    "rollout_child",
    metadata,
    Column("rollout_id", UUID(as_uuid=True), ForeignKey("rollout.id"), nullable=False),
    Column("item_index", Integer, nullable=False),
    Column("parent_execution_id", UUID(as_uuid=True), nullable=False),
    Column("item", JSONB_VALUE, nullable=False),
    # NULL when the child flow refused the item (its data, its key): counted failed.
    Column("request_id", UUID(as_uuid=True)),
    Column("execution_id", UUID(as_uuid=True)),
    Column("status", Text, nullable=False, server_default=text(f"'{RolloutChildStatus.RUNNING}'")),
    Column("refusal", Text),
    _created_at(),
    Column("ended_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("rollout_id", "item_index"),
    # A skipped item never started: it has no row.
    CheckConstraint(_in("status", ROLLOUT_CHILD_STORED), name="status"),
    Index("ux_rollout_child_execution", "execution_id", unique=True),
)


# A one-time sign-in link a hosting panel asked for (migration 0021): the SHA-256 of its
# secret, whom it signs in and where to, until when; using it is one conditional update.
sign_in_link = Table(
    "sign_in_link",
    metadata,
    Column("secret_sha256", Text, primary_key=True),
    Column("org_id", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("next_page", Text, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
    Column("used_at", TIMESTAMP(timezone=True)),
    Index(None, "expires_at"),
)

# The bounds the owner sets at migrate time on what the runtime role may ask of the
# SECURITY DEFINER functions (db/bounds.py): the least retention of each period, the most
# months ahead and rows a call. Written by the owner only; the runtime role reads them.
function_bound = Table(
    "function_bound",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Integer, nullable=False),
    CheckConstraint("value >= 0", name="value_not_negative"),
)

# What the runtime role may do, table by table: DML only, audit append-only, flows immutable.
# No table-level UPDATE: what it may change is RUNTIME_UPDATE_COLUMNS, column by column.
RUNTIME_GRANTS: dict[str, tuple[str, ...]] = {
    "flow": ("SELECT", "INSERT"),
    "request": ("SELECT", "INSERT"),
    "execution": ("SELECT", "INSERT"),
    "action_execution": ("SELECT", "INSERT"),
    "action_attempt": ("SELECT", "INSERT"),
    "audit_event": ("SELECT", "INSERT"),
    "machine_command": ("SELECT", "INSERT", "DELETE"),
    "hosting_plan": ("SELECT", "INSERT", "DELETE"),
    "plan_flow_binding": ("SELECT", "INSERT", "DELETE"),
    "panel_notice": ("SELECT", "INSERT", "DELETE"),
    "notification_opt_out": ("SELECT", "INSERT", "DELETE"),
    "notification_preference": ("SELECT", "INSERT"),
    "email_outbox": ("SELECT", "INSERT", "DELETE"),
    "platform_event": ("SELECT", "INSERT"),
    "machine_credential": ("SELECT",),
    "machine_agent": ("SELECT", "INSERT"),
    "page_session_revocation": ("SELECT", "INSERT", "DELETE"),
    "key_release": ("SELECT", "INSERT", "DELETE"),
    "rate_bucket": ("SELECT", "INSERT"),
    "approval": ("SELECT", "INSERT"),
    "schedule": ("SELECT", "INSERT", "DELETE"),
    "schedule_fire": ("SELECT", "INSERT", "DELETE"),
    "bulk_action": ("SELECT", "INSERT", "DELETE"),
    "bulk_item": ("SELECT", "INSERT", "DELETE"),
    "sign_in_link": ("SELECT", "INSERT", "DELETE"),
    "rollout": ("SELECT", "INSERT"),
    "rollout_child": ("SELECT", "INSERT"),
    "function_bound": ("SELECT",),
}

# The columns the runtime role may UPDATE: exactly those the protocol's statements set
# (queue/, automation/, machines/, notices/, worker/ and orquestador_write_batch). Never
# an identity, an owner, an organization or `simulation`: a real request cannot be
# turned into a dry run's and purged.
ROLLOUT_UPDATE_COLUMNS = (
    "next_index",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "next_start_at",
    "paused_at",
    "paused_by",
    "cancelled_at",
    "cancelled_by",
    "changed_at",
)
RUNTIME_UPDATE_COLUMNS: dict[str, tuple[str, ...]] = {
    "request": ("state", "revision", "data", "busy_execution_id", "updated_at"),
    "execution": (
        "status",
        "attempts",
        "max_attempts",
        "fencing_token",
        "lease_owner",
        "lease_expires_at",
        "next_attempt_at",
        "result",
        "error_code",
        "error_detail",
        "wait_key",
        "started_at",
        "updated_at",
        "finished_at",
        "key_blocked",
        # An operator's retry with a correction moves it with the request's revision.
        "accepted_revision",
        # An operator's retry of an execution parked at MAX_CONTINUATIONS starts it again.
        "continuations",
        # A cancel asked of a RUNNING execution, applied by its holder (migration 0034).
        "cancel_requested_at",
        "cancel_requested_by",
        "cancel_requested_reason",
    ),
    # A new attempt rewrites its checkpoint whole (checkpoints._START's upsert).
    "action_execution": (
        "status",
        "attempt",
        "fencing_token",
        "input_hash",
        "external_key",
        "effect",
        "capability",
        "adapter_version",
        "output",
        "error_code",
        "attempt_base",
        "first_started_at",
        "observed",
        "started_at",
        "finished_at",
    ),
    "machine_command": (
        "status",
        "exit_code",
        "output",
        "updated_at",
        "sent_at",
        "finished_at",
        "cancel_requested_at",
        # A wait moves its command's deliver-by time to its own deadline.
        "deliver_by",
        # The agent's output chunks, kept as head and tail.
        "output_tail",
        "output_received",
        "output_size",
    ),
    "hosting_plan": ("name",),
    "plan_flow_binding": ("flow_id",),
    "panel_notice": ("dismissed_at", "dismissed_by"),
    "notification_preference": ("recipients", "updated_at"),
    "email_outbox": (
        "status",
        "attempts",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
        "last_error",
        "sent_at",
    ),
    # The worker's processing columns: what became of the event.
    "platform_event": ("processed_at", "outcome", "request_id", "execution_id"),
    # Revoking a credential; its machine, organization and expiry are the owner's.
    "machine_credential": ("revoked_at", "revoked_by"),
    # An agent seen again.
    "machine_agent": ("last_seen_at",),
    # Nothing updates a release: a claim takes rows FOR UPDATE SKIP LOCKED, which needs
    # UPDATE on one column, and an identity column can only be "updated" to its default.
    "key_release": ("id",),
    "rate_bucket": ("tokens", "refilled_at"),
    # A decision or the deadline closes an approval; what it asks and of whom never changes.
    "approval": ("status", "decided_by", "decided_at", "comment"),
    # PUT /schedules rewrites what a schedule is; the firing loop advances it. Never its
    # organization, id or creation.
    "schedule": SCHEDULE_UPDATE_COLUMNS,
    # A fire row is written first (it claims the fire time), then names what it started.
    "schedule_fire": ("request_id", "execution_id"),
    # A bulk ends once every item has its outcome; an item's outcome is written once.
    "bulk_action": ("status", "finished_at"),
    "bulk_item": ("outcome", "code", "detail", "finished_at"),
    # A child started, a child's end counted, a pause, a resume, a cancel; never what a
    # rollout runs over (items, flow, data, limits).
    "rollout": ROLLOUT_UPDATE_COLUMNS,
    "rollout_child": ("status", "ended_at"),
    # A link is used once: nothing else of it changes.
    "sign_in_link": ("used_at",),
}

# Migration 0009: the SECURITY DEFINER function through which the runtime role purges
# simulated requests (with their executions, checkpoints and attempts), and nothing else.
PURGE_SIMULATIONS_FUNCTION = "orquestador_purge_simulations"
PURGE_SIMULATIONS_SIGNATURE = f"{PURGE_SIMULATIONS_FUNCTION}(interval, integer)"

# Migration 0010: the protocol writer's batch in one call (queue/batches.py), run with
# the caller's rights; since 0012 executable by the runtime role only.
WRITE_BATCH_FUNCTION = "orquestador_write_batch"
WRITE_BATCH_SIGNATURE = f"{WRITE_BATCH_FUNCTION}(jsonb, jsonb, jsonb, jsonb, jsonb, text)"
# Migration 0015: how many more holders each concurrency key may take, counted under the
# key's advisory lock (queue/claims.py); executable by the runtime role only.
KEY_ROOM_FUNCTION = "orquestador_key_room"
KEY_ROOM_SIGNATURE = f"{KEY_ROOM_FUNCTION}(text[], text[], integer[], integer[])"
# A concurrency key's advisory lock is (KEY_LOCK_CLASS, hashtext(org || '/' || key)): the
# two-key form, which never meets the maintenance leader's one-key lock.
KEY_LOCK_CLASS = 1_907_019
# Migration 0024: the history tables, partitioned by month of this column (UTC months).
# Each has one partition a month, named <table>_pYYYY_MM, and <table>_default for rows
# of a month without one (and rows a dropped month kept).
HISTORY_TABLES: dict[str, str] = {"audit_event": "created_at", "action_attempt": "started_at"}
HISTORY_PARTITION_NAME = re.compile(r"^(audit_event|action_attempt)_(p\d{4}_\d{2}|default)$")
# The SECURITY DEFINER functions through which the maintenance leader (as the runtime
# role, which owns no table) creates months ahead and applies the history's retention.
HISTORY_PARTITIONS_FUNCTION = "orquestador_history_partitions"
HISTORY_PARTITIONS_SIGNATURE = f"{HISTORY_PARTITIONS_FUNCTION}(integer)"
HISTORY_PURGE_FUNCTION = "orquestador_history_purge"
HISTORY_PURGE_SIGNATURE = f"{HISTORY_PURGE_FUNCTION}(interval, interval, integer)"
# The functions the runtime role executes, and only it.
RUNTIME_FUNCTIONS = (
    PURGE_SIMULATIONS_SIGNATURE,
    WRITE_BATCH_SIGNATURE,
    KEY_ROOM_SIGNATURE,
    HISTORY_PARTITIONS_SIGNATURE,
    HISTORY_PURGE_SIGNATURE,
)


def declared_relation(name: str | None, type_: str, parent_names: object = None) -> bool:
    """Whether a schema comparison looks at NAME: not a history table's partition.

    Partitions are made by the migration and the maintenance leader month by month, so
    the declared schema describes only the partitioned tables (alembic's include_name).
    """
    return not (type_ == "table" and name is not None and HISTORY_PARTITION_NAME.match(name))


# Migration 0011: the SQLSTATE the batch raises when a lease it wrote under ran out
# before COMMIT (nothing of the batch is kept).
LEASE_RAN_OUT_SQLSTATE = "OQL01"

# Accepting a transition notifies this channel in the same transaction, so an idle
# worker claims at once instead of waiting for its next poll.
EXECUTION_READY_CHANNEL = "orquestador_execution_ready"
