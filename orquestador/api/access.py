"""ResourceAccess: the only way the API reads requests and executions, with visibility in the SQL.

A caller sees a request when the token's organization is the request's and the caller
owns it or holds requests:read-all; an execution is seen through its request. An
operator route (evidence, decisions, cancel by executions:cancel) reaches every
request of the organization; cancelling with requests:write alone reaches only the
caller's own. Every query below carries that predicate, so a foreign row is
indistinguishable from a missing one.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    and_,
    case,
    cast,
    false,
    func,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import UUID

from orquestador.api.auth import Caller
from orquestador.api.claims import SCOPE_REQUESTS_READ_ALL
from orquestador.approvals.store import WAIT_PREFIX as APPROVAL_WAIT_PREFIX
from orquestador.db.request_machine import REQUEST_MACHINE
from orquestador.db.schema import (
    KEY_HOLDING,
    action_attempt,
    action_execution,
    approval,
    audit_event,
    execution,
    flow,
    machine_command,
    request,
    schedule_fire,
)
from orquestador.domain.statuses import ApprovalStatus, ExecutionStatus
from orquestador.machines.output import VIEW_CHARACTERS
from orquestador.queue.bulk import parks_on_cancel
from orquestador.queue.claims import ATTEMPT_INTERRUPTED


class Reach(enum.Enum):
    """Which requests of the caller's organization a route may touch."""

    # Their own; all of them with requests:read-all.
    READ = "read"
    # Only their own, whatever else the token holds (cancel with requests:write).
    OWN = "own"
    # All of them: routes guarded by an operator scope.
    ORGANIZATION = "organization"


@dataclass(frozen=True)
class KeyWait:
    """A PENDING execution's concurrency key as it stands: full when holders >= limit."""

    key: str
    limit: int
    holders: int
    # The holders the caller may read, oldest first.
    visible: list[uuid.UUID]


@dataclass(frozen=True)
class ExecutionFilter:
    """One page of the execution listing: filters, size and where the last page ended."""

    limit: int
    status: str | None = None
    flow_id: uuid.UUID | None = None
    request_id: uuid.UUID | None = None
    # Dry runs are listed only when asked for, and then only they: a simulated execution
    # never mixes with the real work an operator is looking at.
    simulation: bool = False
    # (created_at, id) of the last item of the previous page; the page starts below it.
    after: tuple[datetime, uuid.UUID] | None = None
    # The leading hex digits of an execution id (a short id, dashes left out): an id
    # names one execution, real or dry run, so it is looked for among both.
    id_prefix: str | None = None
    flow_key: str | None = None
    error_code: str | None = None
    # The request's machine, else the one its data names (as the view's machineId).
    machine_id: str | None = None
    # Created strictly after / strictly before.
    created_after: datetime | None = None
    created_before: datetime | None = None
    # Started by this schedule's fires (a schedule's page lists them).
    schedule_id: str | None = None
    # The children a rollout step's execution started (rollout@1).
    parent_execution_id: uuid.UUID | None = None
    # "created": newest first, page after page; "duration": the longest runs first (from
    # its first claim to its end, or to now), one page only: a keyset cursor follows
    # creation order, not a duration that grows while an execution runs.
    sort: str = "created"


@dataclass(frozen=True)
class BulkFilter:
    """Which executions a bulk action takes: every one of the organization's real
    executions that matches all the criteria given (at least one is)."""

    status: str | None = None
    flow_id: uuid.UUID | None = None
    # Every version of the key.
    flow_key: str | None = None
    error_code: str | None = None
    machine_id: str | None = None
    # Created strictly after / strictly before.
    created_after: datetime | None = None
    created_before: datetime | None = None


# A command's output as a view reads it: the last characters of its head and of its
# tail, and how many bytes were dropped between them (machines/output.py).
_OUTPUT_END = (
    func.right(machine_command.c.output, VIEW_CHARACTERS).label("output_head_end"),
    func.right(machine_command.c.output_tail, VIEW_CHARACTERS).label("output_tail_end"),
    machine_command.c.output_size,
    (
        machine_command.c.output_size
        - func.coalesce(func.octet_length(machine_command.c.output), 0)
        - func.coalesce(func.octet_length(machine_command.c.output_tail), 0)
    ).label("output_dropped"),
)

# The machine the request names, else the one its data names (a moment's machineId).
_request_machine = REQUEST_MACHINE

# The approval a WAITING execution waits on, while a person can still decide it (open,
# before its deadline): until then nothing but a person moves the execution. Its wait key
# names it; another key names no approval (the CASE keeps its text from the cast).
_WAITED_APPROVAL = case(
    (
        execution.c.wait_key.startswith(APPROVAL_WAIT_PREFIX, autoescape=True),
        cast(func.substr(execution.c.wait_key, len(APPROVAL_WAIT_PREFIX) + 1), UUID),
    ),
    else_=None,
)
_OPEN_APPROVAL = (
    select(approval.c.id)
    .where(
        execution.c.status == ExecutionStatus.WAITING,
        approval.c.id == _WAITED_APPROVAL,
        approval.c.org_id == execution.c.org_id,
        approval.c.status == ApprovalStatus.OPEN,
        approval.c.deadline_at > func.clock_timestamp(),
    )
    .scalar_subquery()
)

# The execution this one's finish continued into (at most one: a unique index says so).
_continuation = execution.alias("continuation")
_CONTINUED_BY = (
    select(_continuation.c.id)
    .where(_continuation.c.continued_from == execution.c.id)
    .limit(1)
    .scalar_subquery()
)

_EXECUTION_COLUMNS = (
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
    execution.c.simulation,
    execution.c.accepted_state,
    execution.c.created_at,
    execution.c.updated_at,
    execution.c.priority,
    execution.c.trace_parent,
    _OPEN_APPROVAL.label("open_approval_id"),
    execution.c.continued_from,
    _CONTINUED_BY.label("continued_by"),
    execution.c.parent_execution_id,
    execution.c.cancel_requested_at,
    execution.c.cancel_requested_by,
    execution.c.started_at,
    execution.c.finished_at,
    execution.c.actor_snapshot.op("->>")("sub").label("started_by"),
    flow.c.key.label("flow_key"),
    flow.c.version.label("flow_version"),
    _request_machine.label("machine_id"),
)

# The audit rows that froze what a step saw, explain a decision, list a dry run's
# simulated calls (and its continuation), or say what a cancel did to the machine commands.
VIEW_AUDIT_KINDS = (
    "TRANSITION_CONTINUED",
    "TRANSITION_COMPLETED",
    "STEP_ERROR_EXIT",
    "TRANSITION_FAILED",
    "ACTION_SIMULATED",
    "CANCEL_REQUESTED",
    "EXECUTION_CANCELLED",
    ExecutionStatus.RECONCILIATION_REQUIRED,  # the audit row of a park says its status
    ATTEMPT_INTERRUPTED,
)


class ResourceAccess:
    """Visibility of requests and executions for one caller, expressed as SQL predicates."""

    def __init__(self, caller: Caller, reach: Reach = Reach.READ) -> None:
        self.caller = caller
        self.reach = reach

    def _sees_request(self) -> ColumnElement[bool]:
        same_org = request.c.org_id == self.caller.org
        if self.reach is Reach.ORGANIZATION:
            return same_org
        if self.reach is Reach.READ and self.caller.has_scope(SCOPE_REQUESTS_READ_ALL):
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
            request.c.busy_execution_id,
            request.c.owner_id,
            request.c.simulation,
            request.c.created_at,
            request.c.updated_at,
            func.coalesce(request.c.busy_execution_id, latest).label("execution_id"),
        ).where(request.c.id == request_id, self._sees_request())
        return connection.execute(query).one_or_none()

    def lock_request(self, connection: Connection, request_id: uuid.UUID) -> Row | None:
        """The real request row locked for a real transition, with its pinned flow's definition.

        A dry run's request accepts only dry runs: for a real transition it does not
        exist, exactly like a missing or foreign one.
        """
        query = (
            select(
                request.c.id,
                request.c.org_id,
                request.c.flow_id,
                request.c.state,
                request.c.revision,
                request.c.busy_execution_id,
                request.c.simulation,
                request.c.data,
                flow.c.definition,
            )
            .join(flow, flow.c.id == request.c.flow_id)
            .where(
                request.c.id == request_id,
                self._sees_request(),
                request.c.simulation.is_(false()),
            )
            .with_for_update(of=request)
        )
        return connection.execute(query).one_or_none()

    def find_execution(self, connection: Connection, execution_id: uuid.UUID) -> Row | None:
        query = (
            select(*_EXECUTION_COLUMNS)
            .join(request, request.c.id == execution.c.request_id)
            .join(flow, flow.c.id == execution.c.flow_id)
            .where(execution.c.id == execution_id, self._sees_execution())
        )
        return connection.execute(query).one_or_none()

    def list_executions(self, connection: Connection, page: ExecutionFilter) -> list[Row]:
        """Up to `page.limit` + 1 visible executions, newest first; the extra one says "more".

        Keyset pagination: the page starts strictly below the previous page's last
        (created_at, id), so rows inserted meanwhile never shift or repeat an item.
        """
        conditions = [self._sees_execution()]
        if page.id_prefix is not None:
            # Ids starting with these hex digits are one range of the primary key's order.
            prefix = page.id_prefix.lower()
            conditions.append(
                execution.c.id.between(
                    uuid.UUID(prefix.ljust(32, "0")), uuid.UUID(prefix.ljust(32, "f"))
                )
            )
        else:
            conditions.append(execution.c.simulation == page.simulation)
        if page.status is not None:
            conditions.append(execution.c.status == page.status)
        if page.flow_id is not None:
            conditions.append(execution.c.flow_id == page.flow_id)
        if page.request_id is not None:
            conditions.append(execution.c.request_id == page.request_id)
        if page.flow_key is not None:
            conditions.append(flow.c.key == page.flow_key)
        if page.error_code is not None:
            conditions.append(execution.c.error_code == page.error_code)
        if page.machine_id is not None:
            conditions.append(_request_machine == page.machine_id)
        if page.schedule_id is not None:
            # The schedule's fire rows name what each fire started (organization and
            # schedule in the WHERE: another organization's schedule of the same id too).
            conditions.append(
                execution.c.id.in_(
                    select(schedule_fire.c.execution_id).where(
                        schedule_fire.c.org_id == self.caller.org,
                        schedule_fire.c.schedule_id == page.schedule_id,
                        schedule_fire.c.execution_id.is_not(None),
                    )
                )
            )
        if page.created_after is not None:
            conditions.append(execution.c.created_at > page.created_after)
        if page.created_before is not None:
            conditions.append(execution.c.created_at < page.created_before)
        if page.parent_execution_id is not None:
            conditions.append(execution.c.parent_execution_id == page.parent_execution_id)
        if page.after is not None:
            conditions.append(tuple_(execution.c.created_at, execution.c.id) < tuple_(*page.after))
        order = [execution.c.created_at.desc(), execution.c.id.desc()]
        if page.sort == "duration":
            ran = func.coalesce(execution.c.finished_at, func.clock_timestamp()) - (
                execution.c.started_at
            )
            order = [ran.desc().nulls_last(), *order]
        query = (
            select(*_EXECUTION_COLUMNS)
            .join(request, request.c.id == execution.c.request_id)
            .join(flow, flow.c.id == execution.c.flow_id)
            .where(*conditions)
            .order_by(*order)
            .limit(page.limit + 1)
        )
        return list(connection.execute(query))

    def _bulk_conditions(self, found: BulkFilter) -> list[ColumnElement[bool]]:
        # Dry runs are never acted on in bulk: they are not the real work an operator means.
        conditions = [self._sees_execution(), execution.c.simulation.is_(false())]
        if found.status is not None:
            conditions.append(execution.c.status == found.status)
        if found.flow_id is not None:
            conditions.append(execution.c.flow_id == found.flow_id)
        if found.flow_key is not None:
            versions = select(flow.c.id).where(
                flow.c.org_id == self.caller.org, flow.c.key == found.flow_key
            )
            conditions.append(execution.c.flow_id.in_(versions))
        if found.error_code is not None:
            conditions.append(execution.c.error_code == found.error_code)
        if found.machine_id is not None:
            conditions.append(_request_machine == found.machine_id)
        if found.created_after is not None:
            conditions.append(execution.c.created_at > found.created_after)
        if found.created_before is not None:
            conditions.append(execution.c.created_at < found.created_before)
        return conditions

    def bulk_matches(self, found: BulkFilter) -> Select[tuple[uuid.UUID, datetime]]:
        """The visible executions a bulk filter matches, as a query to embed: each id, and
        its `updated_at` as the bulk found it (a decision item acts on that episode only)."""
        return (
            select(execution.c.id, execution.c.updated_at)
            .join(request, request.c.id == execution.c.request_id)
            .where(*self._bulk_conditions(found))
        )

    def bulk_preview(
        self, connection: Connection, found: BulkFilter, sample_size: int, *, cancel: bool
    ) -> tuple[int, int, list[Row]]:
        """How many visible executions a bulk filter matches, how many of them a cancel
        would park rather than end (the write rule; 0 unless `cancel`), and the newest of
        them, each with `parks`."""
        parks = parks_on_cancel(execution.c.id) if cancel else false()
        matched = (
            select(execution.c.id, parks.label("parks"))
            .join(request, request.c.id == execution.c.request_id)
            .where(*self._bulk_conditions(found))
            .subquery()
        )
        count, parking = connection.execute(
            select(func.count(), func.count().filter(matched.c.parks.is_(true()))).select_from(
                matched
            )
        ).one()
        sample = connection.execute(
            select(*_EXECUTION_COLUMNS, parks.label("parks"))
            .join(request, request.c.id == execution.c.request_id)
            .join(flow, flow.c.id == execution.c.flow_id)
            .where(*self._bulk_conditions(found))
            .order_by(execution.c.created_at.desc(), execution.c.id.desc())
            .limit(sample_size)
        ).all()
        return count, parking, list(sample)

    def execution_steps(self, connection: Connection, execution_id: uuid.UUID) -> list[Row]:
        """Checkpoint statuses of a visible execution, in the order the actions started."""
        return self.steps_of(connection, [execution_id])

    def steps_of(self, connection: Connection, execution_ids: Sequence[uuid.UUID]) -> list[Row]:
        """Checkpoint statuses of many visible executions in one query, each in start order."""
        query = (
            select(
                action_execution.c.execution_id,
                action_execution.c.action_id,
                action_execution.c.status,
                action_execution.c.attempt,
                action_execution.c.error_code,
                action_execution.c.started_at,
                action_execution.c.first_started_at,
                action_execution.c.finished_at,
                # A wait's latest look at its command: what a WAITING step waits for.
                action_execution.c.observed,
                action_execution.c.capability,
            )
            .join(execution, execution.c.id == action_execution.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(action_execution.c.execution_id.in_(execution_ids), self._sees_execution())
            .order_by(
                action_execution.c.execution_id,
                action_execution.c.started_at,
                action_execution.c.action_id,
            )
        )
        return list(connection.execute(query))

    def execution_attempts(self, connection: Connection, execution_id: uuid.UUID) -> list[Row]:
        """Every ended attempt of a visible execution's actions, oldest first."""
        return self.attempts_of(connection, [execution_id])

    def attempts_of(self, connection: Connection, execution_ids: Sequence[uuid.UUID]) -> list[Row]:
        """Every ended attempt of many visible executions in one query, oldest first."""
        query = (
            select(
                action_attempt.c.execution_id,
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
            .where(action_attempt.c.execution_id.in_(execution_ids), self._sees_execution())
            .order_by(
                action_attempt.c.execution_id,
                action_attempt.c.action_id,
                action_attempt.c.attempt,
            )
        )
        return list(connection.execute(query))

    def evidence_steps(self, connection: Connection, execution_id: uuid.UUID) -> list[Row]:
        """Every checkpoint of a visible execution as an operator needs it, in start order.

        The order is the one the protocol decides with (`step_in_doubt`). Never the
        action's input: the input hash identifies it without showing it.
        """
        query = (
            select(
                action_execution.c.action_id,
                action_execution.c.capability,
                action_execution.c.adapter_version,
                action_execution.c.effect,
                action_execution.c.status,
                action_execution.c.attempt,
                action_execution.c.external_key,
                action_execution.c.input_hash,
                action_execution.c.error_code,
                action_execution.c.output,
                action_execution.c.started_at,
                action_execution.c.first_started_at,
                action_execution.c.finished_at,
            )
            .join(execution, execution.c.id == action_execution.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(action_execution.c.execution_id == execution_id, self._sees_execution())
            .order_by(action_execution.c.started_at, action_execution.c.action_id)
        )
        return list(connection.execute(query))

    def execution_audit(
        self,
        connection: Connection,
        execution_id: uuid.UUID,
        kinds: Sequence[str] | None = None,
    ) -> list[Row]:
        """The audit trail of a visible execution (only `kinds` when given), oldest first."""
        conditions = [
            audit_event.c.execution_id == execution_id,
            audit_event.c.org_id == self.caller.org,
            self._sees_execution(),
        ]
        if kinds is not None:
            conditions.append(audit_event.c.kind.in_(kinds))
        query = (
            select(
                audit_event.c.kind,
                audit_event.c.actor,
                audit_event.c.detail,
                audit_event.c.created_at,
            )
            .join(execution, execution.c.id == audit_event.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(*conditions)
            .order_by(audit_event.c.id)
        )
        return list(connection.execute(query))

    def view_audit_of(
        self, connection: Connection, execution_ids: Sequence[uuid.UUID]
    ) -> list[Row]:
        """The audit rows an ExecutionView reads (VIEW_AUDIT_KINDS) of many visible
        executions in one query, each execution's in the order they were written."""
        query = (
            select(
                audit_event.c.execution_id,
                audit_event.c.kind,
                audit_event.c.detail,
                audit_event.c.created_at,
            )
            .join(execution, execution.c.id == audit_event.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(
                audit_event.c.execution_id.in_(execution_ids),
                audit_event.c.org_id == self.caller.org,
                audit_event.c.kind.in_(VIEW_AUDIT_KINDS),
                self._sees_execution(),
            )
            .order_by(audit_event.c.execution_id, audit_event.c.id)
        )
        return list(connection.execute(query))

    def waiting_contexts(
        self, connection: Connection, execution_ids: Sequence[uuid.UUID]
    ) -> list[Row]:
        """For the visible WAITING executions among `execution_ids`: the flow definition
        and the request data a wait's inputs were resolved from.

        The request is busy while its execution waits, so its data is still the data the
        transition was accepted with.
        """
        query = (
            select(
                execution.c.id,
                execution.c.transition_id,
                flow.c.definition,
                request.c.data,
            )
            .join(request, request.c.id == execution.c.request_id)
            .join(flow, flow.c.id == execution.c.flow_id)
            .where(
                execution.c.id.in_(execution_ids),
                execution.c.status == ExecutionStatus.WAITING,
                self._sees_execution(),
            )
        )
        return list(connection.execute(query))

    def key_holders(
        self, connection: Connection, execution_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, KeyWait]:
        """For the visible PENDING executions among `execution_ids` that wait for a place
        under a concurrency key they do not hold yet: the key, its limit, how many hold it
        in the caller's organization, and the holders the caller may see (oldest first)."""
        waiting = connection.execute(
            select(execution.c.id, execution.c.concurrency_key, execution.c.concurrency_limit)
            .join(request, request.c.id == execution.c.request_id)
            .where(
                execution.c.id.in_(execution_ids),
                execution.c.status == ExecutionStatus.PENDING,
                execution.c.started_at.is_(None),
                execution.c.concurrency_key.is_not(None),
                self._sees_execution(),
            )
        ).all()
        if not waiting:
            return {}
        keys = sorted({row.concurrency_key for row in waiting})
        holders = connection.execute(
            select(
                execution.c.id,
                execution.c.concurrency_key,
                self._sees_request().label("visible"),
            )
            .join(request, request.c.id == execution.c.request_id)
            .where(
                execution.c.org_id == self.caller.org,
                execution.c.concurrency_key.in_(keys),
                text(KEY_HOLDING),
            )
            .order_by(execution.c.started_at, execution.c.id)
        ).all()
        by_key: dict[str, list[Row]] = {}
        for holder in holders:
            by_key.setdefault(holder.concurrency_key, []).append(holder)
        return {
            row.id: KeyWait(
                key=row.concurrency_key,
                limit=row.concurrency_limit,
                holders=len(by_key.get(row.concurrency_key, [])),
                visible=[h.id for h in by_key.get(row.concurrency_key, []) if h.visible],
            )
            for row in waiting
        }

    def commands_now(
        self, connection: Connection, command_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Row]:
        """The current rows of machine commands, by id, within the caller's organization.

        The ids come from JSON the audit froze, not from a foreign key: the organization
        bounds the look-up, so an id that names another organization's command finds
        nothing, exactly like a purged one.
        """
        if not command_ids:
            return {}
        query = select(
            machine_command.c.id,
            machine_command.c.status,
            machine_command.c.updated_at,
            machine_command.c.machine_id,
            machine_command.c.command,
            machine_command.c.args,
            machine_command.c.deliver_by,
            *_OUTPUT_END,
        ).where(
            machine_command.c.org_id == self.caller.org,
            machine_command.c.id.in_(command_ids),
        )
        return {row.id: row for row in connection.execute(query)}

    def machine_commands(self, connection: Connection, machine_id: str, limit: int) -> list[Row]:
        """Up to `limit` + 1 commands sent to a machine by executions the caller may see,
        newest first, each with the execution that sent it.

        A command's external key is the step's that sent it: the join finds the
        execution, whose request says whether the caller may see it.
        """
        query = (
            select(
                machine_command.c.id,
                machine_command.c.command,
                machine_command.c.args,
                machine_command.c.status,
                machine_command.c.exit_code,
                machine_command.c.created_at,
                machine_command.c.updated_at,
                machine_command.c.sent_at,
                machine_command.c.finished_at,
                machine_command.c.cancel_requested_at,
                machine_command.c.deliver_by,
                *_OUTPUT_END,
                action_execution.c.execution_id,
                action_execution.c.action_id,
            )
            .join(
                action_execution,
                action_execution.c.external_key == machine_command.c.external_key,
            )
            .join(execution, execution.c.id == action_execution.c.execution_id)
            .join(request, request.c.id == execution.c.request_id)
            .where(
                machine_command.c.org_id == self.caller.org,
                machine_command.c.machine_id == machine_id,
                self._sees_execution(),
            )
            .order_by(machine_command.c.created_at.desc(), machine_command.c.id.desc())
            .limit(limit + 1)
        )
        return list(connection.execute(query))
