"""What a worker knows of a claimed execution: the accepted snapshot and its checkpoints."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    """One action_execution row as recovery sees it."""

    action_id: str
    status: str
    attempt: int
    fencing_token: int
    input_hash: str
    external_key: str
    effect: str
    capability: str
    adapter_version: int
    output: Any
    error_code: str | None
    attempt_base: int = 0  # an approved retry's budget counts attempts after this one
    first_started_at: datetime | None = None  # the step's first start, database time
    observed: dict[str, Any] | None = None  # what the step saw last

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Checkpoint:
        """From the load's JSON object (timestamps arrive as ISO 8601 text)."""
        started = values.get("first_started_at")
        return cls(
            **{
                **values,
                "first_started_at": datetime.fromisoformat(started) if started else None,
            }
        )

    @property
    def attempts_in_budget(self) -> int:
        return self.attempt - self.attempt_base


@dataclass(frozen=True)
class LoadedExecution:
    """What the worker needs to run an execution, read under the fence in one statement."""

    execution_id: uuid.UUID
    request_id: uuid.UUID
    org_id: str
    flow_id: uuid.UUID
    transition_id: str
    accepted_state: str
    accepted_revision: int
    attempts: int
    max_attempts: int
    simulation: bool
    actor: str | None
    created_at: datetime
    request_state: str
    request_revision: int
    request_flow_id: uuid.UUID
    request_busy_execution_id: uuid.UUID | None
    owner_id: str
    data: Any
    flow_version: int
    definition: dict[str, Any]
    data_schema: dict[str, Any]
    checkpoints: dict[str, Checkpoint]
    # A person asked to cancel it while an earlier holder's call ran (queue/cancel_requests.py).
    # A first claim's row never carries one: a cancel asked before any claim ends it.
    cancel_requested: bool = False

    @classmethod
    def from_row(cls, row: Any, checkpoints: dict[str, Checkpoint]) -> LoadedExecution:
        """Built from a row carrying the load's columns (the load's, or a first claim's)."""
        return cls(
            execution_id=row.id,
            request_id=row.request_id,
            org_id=row.org_id,
            flow_id=row.flow_id,
            transition_id=row.transition_id,
            accepted_state=row.accepted_state,
            accepted_revision=row.accepted_revision,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            simulation=row.simulation,
            actor=row.actor,
            created_at=row.created_at,
            request_state=row.request_state,
            request_revision=row.request_revision,
            request_flow_id=row.request_flow_id,
            request_busy_execution_id=row.busy_execution_id,
            owner_id=row.owner_id,
            data=row.data,
            flow_version=row.flow_version,
            definition=row.definition,
            data_schema=row.data_schema,
            checkpoints=checkpoints,
            cancel_requested=bool(getattr(row, "cancel_requested", False)),
        )

    def request_changed(self) -> str | None:
        """Why the request no longer is what was accepted, or None when it is unchanged."""
        if self.request_busy_execution_id != self.execution_id:
            return "the request is no longer held by this execution"
        if self.request_flow_id != self.flow_id:
            return "the request is pinned to another flow version"
        if self.request_state != self.accepted_state:
            return f"state is {self.request_state!r}, accepted in {self.accepted_state!r}"
        if self.request_revision != self.accepted_revision:
            return f"revision is {self.request_revision}, accepted at {self.accepted_revision}"
        return None
