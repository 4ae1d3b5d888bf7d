"""ResourceAccess: the only way the API reads requests and executions, with visibility in the SQL.

A caller sees a request when the token's organization is the request's and the caller
owns it or holds requests:read-all; an execution is seen through its request. Every
query below carries that predicate, so a foreign row is indistinguishable from a
missing one.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, Connection, Row, and_, func, select

from orquestador.api.auth import SCOPE_REQUESTS_READ_ALL, Caller
from orquestador.db.schema import action_attempt, action_execution, execution, flow, request


class ResourceAccess:
    """Visibility of requests and executions for one caller, expressed as SQL predicates."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def _sees_request(self) -> ColumnElement[bool]:
        same_org = request.c.org_id == self.caller.org
        if self.caller.has_scope(SCOPE_REQUESTS_READ_ALL):
            return same_org
        return and_(same_org, request.c.owner_id == self.caller.sub)

    def _sees_execution(self) -> ColumnElement[bool]:
        # Callers must join request on execution.request_id; the owner lives there.
        return and_(execution.c.org_id == self.caller.org, self._sees_request())

    def find_request(self, connection: Connection, request_id: uuid.UUID) -> Row | None:
        """The request with its current execution: the busy one, else the latest."""
        latest = (
            select(execution.c.id)
            .where(execution.c.request_id == request.c.id)
            .order_by(execution.c.created_at.desc(), execution.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        query = select(
            request.c.id,
            request.c.flow_id,
            request.c.state,
            request.c.revision,
            request.c.data,
            request.c.machine_id,
            func.coalesce(request.c.busy_execution_id, latest).label("execution_id"),
        ).where(request.c.id == request_id, self._sees_request())
        return connection.execute(query).one_or_none()

    def lock_request(self, connection: Connection, request_id: uuid.UUID) -> Row | None:
        """The request row locked for a write, with its pinned flow's definition."""
        query = (
            select(
                request.c.id,
                request.c.org_id,
                request.c.flow_id,
                request.c.state,
                request.c.revision,
                request.c.busy_execution_id,
                flow.c.definition,
            )
            .join(flow, flow.c.id == request.c.flow_id)
            .where(request.c.id == request_id, self._sees_request())
            .with_for_update(of=request)
        )
        return connection.execute(query).one_or_none()

    def find_execution(self, connection: Connection, execution_id: uuid.UUID) -> Row | None:
        query = (
            select(
                execution.c.id,
                execution.c.request_id,
                execution.c.flow_id,
                execution.c.transition_id,
                execution.c.status,
                execution.c.result,
                execution.c.error_code,
                execution.c.error_detail,
                execution.c.next_attempt_at,
                execution.c.attempts,
                execution.c.created_at,
                execution.c.updated_at,
            )
            .join(request, request.c.id == execution.c.request_id)
            .where(execution.c.id == execution_id, self._sees_execution())
        )
        return connection.execute(query).one_or_none()

    def execution_steps(self, connection: Connection, execution_id: uuid.UUID) -> list[Row]:
        """Checkpoint statuses of a visible execution, in the order the actions started."""
        query = (
            select(
                action_execution.c.action_id,
                action_execution.c.status,
                action_execution.c.attempt,
                action_execution.c.error_code,
                action_execution.c.started_at,
                action_execution.c.finished_at,
            )
            .join(execution, execution.c.id == action_execution.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(action_execution.c.execution_id == execution_id, self._sees_execution())
            .order_by(action_execution.c.started_at, action_execution.c.action_id)
        )
        return list(connection.execute(query))

    def execution_attempts(self, connection: Connection, execution_id: uuid.UUID) -> list[Row]:
        """Every ended attempt of a visible execution's actions, oldest first."""
        query = (
            select(
                action_attempt.c.action_id,
                action_attempt.c.attempt,
                action_attempt.c.status,
                action_attempt.c.error_code,
                action_attempt.c.message,
                action_attempt.c.started_at,
                action_attempt.c.finished_at,
            )
            .join(execution, execution.c.id == action_attempt.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(action_attempt.c.execution_id == execution_id, self._sees_execution())
            .order_by(action_attempt.c.action_id, action_attempt.c.attempt)
        )
        return list(connection.execute(query))
