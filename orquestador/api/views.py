"""The JSON shapes the API answers with, built from database rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row

API_PREFIX = "/api/v1"

# ExecutionView shows at most these keys of execution.result: the business outcome,
# never raw provider output.
_RESULT_KEYS = {"outcome": "outcome", "toState": "toState"}


def timestamp(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z suffix."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def flow_created_view(row: Row, warnings: list[dict[str, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "key": row.key,
        "version": row.version,
        "trigger": row.trigger,
    }
    if warnings:
        body["warnings"] = warnings
    return body


def flow_view(row: Row) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "key": row.key,
        "version": row.version,
        "trigger": row.trigger,
        "createdBy": row.created_by,
        "createdAt": timestamp(row.created_at),
        "definition": row.definition,
    }


def request_view(row: Row, *, execution_id: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "flowId": str(row.flow_id),
        "state": row.state,
        "revision": row.revision,
        "data": row.data,
    }
    if row.machine_id is not None:
        body["machineId"] = row.machine_id
    if execution_id is not None:
        body["executionId"] = str(execution_id)
    return body


def execution_view(row: Row, steps: Iterable[Row], attempts: Iterable[Row]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row.id),
        "requestId": str(row.request_id),
        "flowId": str(row.flow_id),
        "transitionId": row.transition_id,
        "status": row.status,
    }
    result = row.result if isinstance(row.result, dict) else {}
    for source, target in _RESULT_KEYS.items():
        if result.get(source) is not None:
            body[target] = result[source]
    if row.error_code is not None:
        body["errorCode"] = row.error_code
    if row.error_detail:
        # Where it failed (action, pointer, schema paths); the worker stores no values.
        body["errorDetail"] = row.error_detail
    waiting = row.status == "RETRY_WAIT"
    if waiting:
        body["nextAttemptAt"] = timestamp(row.next_attempt_at)
    body["attempts"] = row.attempts
    by_action: dict[str, list[Row]] = {}
    for attempt in attempts:
        by_action.setdefault(attempt.action_id, []).append(attempt)
    body["steps"] = [
        _step_view(
            step, by_action.get(step.action_id, []), row.next_attempt_at if waiting else None
        )
        for step in steps
    ]
    body["createdAt"] = timestamp(row.created_at)
    body["updatedAt"] = timestamp(row.updated_at)
    return body


def _step_view(step: Row, ended: list[Row], next_attempt_at: datetime | None) -> dict[str, Any]:
    body: dict[str, Any] = {"actionId": step.action_id, "status": step.status}
    if step.started_at is not None:
        body["startedAt"] = timestamp(step.started_at)
    if step.finished_at is not None:
        body["finishedAt"] = timestamp(step.finished_at)
    if step.error_code is not None:
        body["errorCode"] = step.error_code
    history = [_attempt_view(a) for a in ended]
    if step.status == "RUNNING":  # the attempt under way has not ended: not in the history
        history.append(
            {"attempt": step.attempt, "status": "RUNNING", "startedAt": timestamp(step.started_at)}
        )
    body["attempts"] = history
    if next_attempt_at is not None and step.status in ("FAILED", "UNKNOWN"):
        body["nextAttemptAt"] = timestamp(next_attempt_at)
    return body


def _attempt_view(attempt: Row) -> dict[str, Any]:
    body: dict[str, Any] = {
        "attempt": attempt.attempt,
        "status": attempt.status,
        "startedAt": timestamp(attempt.started_at),
    }
    if attempt.finished_at is not None:
        body["finishedAt"] = timestamp(attempt.finished_at)
    if attempt.error_code is not None:
        body["errorCode"] = attempt.error_code
    if attempt.message is not None:
        body["message"] = attempt.message
    return body
