"""Arranging the history (audit rows, attempts, monthly partitions) of ended executions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from tests.integration.worker_support import (
    ORG,
    accept_transition,
    create_request,
    flow_definition,
    publish_flow,
)

# Months reach back this far, so the oldest ones are past the longer period (365 days).
OLDEST_DAYS = 520


def months_back(owner: Engine, tables: tuple[str, ...] = ("audit_event", "action_attempt")) -> None:
    """Monthly partitions back to OLDEST_DAYS ago, as a database that ran for long has."""
    with owner.begin() as conn:
        for table in tables:
            conn.execute(
                text(
                    "SELECT orquestador_history_month(:table, month::date)"
                    " FROM generate_series(date_trunc('month', (now() - make_interval("
                    " days => :days)) AT TIME ZONE 'UTC'), now(), interval '1 month') month"
                ),
                {"table": table, "days": OLDEST_DAYS},
            )


def execution_with(owner: Engine, status: str, finished_days_ago: float | None) -> uuid.UUID:
    flow_id = publish_flow(owner, flow_definition([]))
    execution_id = accept_transition(owner, create_request(owner, flow_id))
    with owner.begin() as conn:
        # The acceptance's own audit row is written now: this history starts earlier.
        conn.execute(text("DELETE FROM audit_event WHERE execution_id = :id"), {"id": execution_id})
        conn.execute(
            text(
                "UPDATE execution SET status = :status,"
                " finished_at = now() - make_interval(days => :days) WHERE id = :id"
            ),
            {"status": status, "days": finished_days_ago, "id": execution_id},
        )
        conn.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " VALUES (:id, 'a', 'FAILED', 2, 1, 'h', :key, 'READ_ONLY', 'test.read', 1)"
            ),
            {"id": execution_id, "key": f"{execution_id}:a"},
        )
    return execution_id


def write_history(owner: Engine, execution_id: uuid.UUID | None, days_ago: float) -> None:
    """An audit row and (for an execution) an attempt, written DAYS_AGO."""
    with owner.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, execution_id, created_at)"
                " VALUES (:org, 'K', :id, now() - make_interval(days => :days))"
            ),
            {"org": ORG, "id": execution_id, "days": days_ago},
        )
        if execution_id is not None:
            conn.execute(
                text(
                    "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                    " status, started_at) SELECT :id, 'a', coalesce(max(attempt), 0) + 1, 1,"
                    " 'FAILED', now() - make_interval(days => :days)"
                    " FROM action_attempt WHERE execution_id = :id"
                ),
                {"id": execution_id, "days": days_ago},
            )


def history_rows(owner: Engine, execution_id: uuid.UUID) -> tuple[int, int]:
    with owner.connect() as conn:
        audit = conn.execute(
            text("SELECT count(*) FROM audit_event WHERE execution_id = :id"), {"id": execution_id}
        ).scalar_one()
        attempts = conn.execute(
            text("SELECT count(*) FROM action_attempt WHERE execution_id = :id"),
            {"id": execution_id},
        ).scalar_one()
    return audit, attempts


def partitions_of(owner: Engine, table: str) -> set[str]:
    with owner.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = CAST(:table AS regclass)"
                ),
                {"table": table},
            ).scalars()
        )


def month_suffix(days_ago: int) -> str:
    """The partition suffix of the UTC month DAYS_AGO ago (negative: ahead)."""
    return (datetime.now(UTC) - timedelta(days=days_ago)).strftime("%Y_%m")
