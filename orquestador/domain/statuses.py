"""Every status vocabulary, one `StrEnum` each, and one named set per idea ("unfinished").

The database's CHECK constraints (db/schema.py), the API's schemas and the command line
all take their lists from here, so a status is spelled once.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TypeVar

Member = TypeVar("Member", bound=StrEnum)


class ExecutionStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    WAITING = "WAITING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RECONCILIATION_REQUIRED = "RECONCILIATION_REQUIRED"
    CANCELLED = "CANCELLED"


# An execution that will still move by itself: a worker holds it, will claim it, or
# wakes it. A parked one (RECONCILIATION_REQUIRED) waits for a person, not the engine.
UNFINISHED = frozenset(
    {
        ExecutionStatus.PENDING,
        ExecutionStatus.RUNNING,
        ExecutionStatus.RETRY_WAIT,
        ExecutionStatus.WAITING,
    }
)
# Unfinished and held by no worker: the claim takes one once it is due (ix_execution_ready),
# and a cancel ends one without racing a holder.
UNHELD = UNFINISHED - {ExecutionStatus.RUNNING}
# Where an execution ends: nothing moves it again.
FINAL = frozenset({ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})
# Not ended yet, parked ones too: what the quota openExecutions counts.
OPEN = frozenset(ExecutionStatus) - FINAL


class CheckpointStatus(StrEnum):
    """A step's checkpoint (`action_execution`)."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


# How an attempt ended (`action_attempt`): a checkpoint's status once it is no longer RUNNING.
# An attempt interrupted before anyone saw its end is FAILED (a read) or UNKNOWN (a write).
ENDED_CHECKPOINT = frozenset(
    {CheckpointStatus.SUCCEEDED, CheckpointStatus.FAILED, CheckpointStatus.UNKNOWN}
)


class StepStatus(StrEnum):
    """A step as the API shows it: its checkpoint's status, except a durable wait between
    its rounds (its checkpoint rests FAILED, NOT_READY), which is WAITING while the
    execution is unfinished and STOPPED once it ended without the wait's answer."""

    RUNNING = "RUNNING"
    WAITING = "WAITING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


class CommandStatus(StrEnum):
    """A machine command, moving forward only."""

    PENDING = "pending"
    SENT = "sent"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    # Never delivered: its deliver-by time passed before any agent took it (or the agent
    # that was handed it late refused it).
    EXPIRED = "expired"


# A command on its way: no agent took it yet, or one took it and has not said how it ended.
UNDER_WAY_COMMAND = frozenset({CommandStatus.PENDING, CommandStatus.SENT, CommandStatus.RUNNING})
FINAL_COMMAND = frozenset(
    {
        CommandStatus.SUCCEEDED,
        CommandStatus.FAILED,
        CommandStatus.TIMED_OUT,
        CommandStatus.CANCELLED,
        CommandStatus.EXPIRED,
    }
)


class ApprovalStatus(StrEnum):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class ApprovalListing(StrEnum):
    """Which approvals a list shows: the open ones a person may still decide, the closed
    ones (decided, expired, past their deadline or their execution ended), or all."""

    OPEN = "open"
    CLOSED = "closed"
    ALL = "all"


class OutboxStatus(StrEnum):
    """An e-mail in the outbox (`email_outbox`)."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class BulkAction(StrEnum):
    CANCEL = "cancel"
    RETRY = "retry"
    FAIL = "fail"


class BulkStatus(StrEnum):
    """A bulk action: RUNNING until every item has its outcome."""

    RUNNING = "RUNNING"
    DONE = "DONE"


class BulkItemOutcome(StrEnum):
    """SUCCEEDED: done as asked. PARKED: a cancel the write rule turned into a park for an
    operator (CANCELLED_AFTER_WRITES). REFUSED: the normal rules refused it (its code)."""

    SUCCEEDED = "SUCCEEDED"
    PARKED = "PARKED"
    REFUSED = "REFUSED"


class RolloutChildStatus(StrEnum):
    """A rollout's item as the rollout counts it (rollout@1). A child execution parked for a
    person counts as failed: the rollout does not wait for the person."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Never started: the budget was spent or the rollout cancelled first (output only).
    SKIPPED = "skipped"


# A rollout's item as the rollout's view shows it, besides its child's status: no child
# started yet, and the rollout may still start one (output only, never stored).
ROLLOUT_ITEM_WAITING = "waiting"

# The execution statuses that end a child for its rollout, and what each counts as.
ROLLOUT_CHILD_ENDS: dict[ExecutionStatus, RolloutChildStatus] = {
    ExecutionStatus.SUCCEEDED: RolloutChildStatus.SUCCEEDED,
    ExecutionStatus.FAILED: RolloutChildStatus.FAILED,
    ExecutionStatus.RECONCILIATION_REQUIRED: RolloutChildStatus.FAILED,
    ExecutionStatus.CANCELLED: RolloutChildStatus.CANCELLED,
}


def in_order(members: Iterable[Member]) -> list[Member]:
    """A set of statuses in their enum's order, so that words and SQL built from it are
    the same on every run."""
    chosen = set(members)
    if not chosen:
        return []
    vocabulary = type(next(iter(chosen)))
    return [member for member in vocabulary if member in chosen]


def values(vocabulary: type[StrEnum]) -> tuple[str, ...]:
    """A vocabulary's values as plain strings, in declaration order (CHECKs, `choices`)."""
    return tuple(member.value for member in vocabulary)
