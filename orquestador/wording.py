"""Words the pages and the command line share, so that both say a thing the same way."""

from __future__ import annotations

from typing import Any

from orquestador.domain.statuses import BulkAction, CommandStatus


def duration_in_words(seconds: int) -> str:
    """A duration as a person says it: 45 s, 2 min 5 s, 3 h 20 min."""
    minutes, rest = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return f"{rest} s"


def counted(number: int, noun: str) -> str:
    """`1 flow`, `2 flows`: a count and its noun (a regular plural)."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


# What a machine command's status means to a person, where the bare word does not say it.
COMMAND_STATUS_MEANINGS = {
    CommandStatus.PENDING: "no agent has taken it yet",
    CommandStatus.SENT: "its agent took it",
    CommandStatus.RUNNING: "running on the machine",
    CommandStatus.TIMED_OUT: "its agent stopped it when its time ran out",
    CommandStatus.CANCELLED: "stopped, or withdrawn before any agent took it",
    CommandStatus.EXPIRED: "never delivered: no agent took it before its deliver-by time",
}


def command_status_meaning(status: str) -> str:
    """What a command status means, in words ('' when the status says it itself)."""
    return COMMAND_STATUS_MEANINGS.get(status, "")


# What a bulk action did to an item it acted on as asked.
BULK_DONE_WORDS = {
    BulkAction.CANCEL: "cancelled",
    BulkAction.RETRY: "sent to run again",
    BulkAction.FAIL: "failed",
}


def bulk_outcome_in_words(progress: dict[str, Any]) -> str:
    """A bulk's outcome so far (GET /bulk/{id}'s view) as a person says it: what took
    effect first, then what was parked for a decision, then what the rules refused."""
    requested = len(progress.get("cancelRequested", []))
    done = progress["succeeded"] - requested
    said = [f"{done} {BULK_DONE_WORDS.get(progress['action'], 'done')}"]
    if requested:
        said.append(f"{requested} to stop when their step's call returns")
    parked = len(progress.get("parked", []))
    if parked:
        said.append(f"{parked} parked for a decision")
    said.append(f"{len(progress['refused'])} refused")
    return ", ".join(said)
