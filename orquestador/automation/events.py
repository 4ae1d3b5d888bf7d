"""Platform events: each (organization, event id) starts the flow bound to its plan's moment once.

Both ways in end here. POST /events records the row and processes it in the same
transaction; a row the platform inserted itself is processed by the worker's consumer.
Processing happens with the event row locked and only while `processed_at` is NULL, and
it writes the event's outcome, the request, the accepted execution of the flow's `start`
transition, its audit row and the NOTIFY in one transaction: exactly once, whoever wins.

An event that cannot be processed (data PostgreSQL stores but Python cannot read, data
too large, any unexpected failure) is recorded REJECTED with why on its first attempt,
in a savepoint of its own, so it never stands in front of the events behind it.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError

from orquestador import tracing
from orquestador.db.engine import is_retriable
from orquestador.db.schema import audit_event, flow, hosting_plan, plan_flow_binding, platform_event
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.errors import DataValidationError
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.limits import MAX_DATA_BYTES, MAX_DATA_DEPTH, MAX_EVENT_DATA_TEXT_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.errors import Problem
from orquestador.queue.acceptance import insert_request, queue_execution

log = logging.getLogger(__name__)

# Who owns what the platform's own inserts start (no token names a caller there).
PLATFORM_ACTOR = "platform"
# Why an event started nothing.
NO_BINDING = "NO_BINDING"
REJECTED = "REJECTED"
STARTED = "STARTED"
# The audit row that keeps why an event was refused: its answer is rebuilt from it.
REJECTED_KIND = "PLATFORM_EVENT_REJECTED"
# The audit row that keeps whether an event that found no flow named a plan at all.
NOT_BOUND_KIND = "PLATFORM_EVENT_NOT_BOUND"
# What a NO_BINDING answer says of the plan: none has the event's planId in the
# organization, or one has and binds no flow to the moment.
PLAN_UNKNOWN = "unknown"
PLAN_UNBOUND = "unbound"
# Every column but `data`, which is read alone inside the event's savepoint
# (`read_event_data`): PostgreSQL stores documents Python cannot load (nested thousands
# deep, numbers of thousands of digits), and loading one with a batch would fail the batch.
_EVENT_COLUMNS = tuple(column for column in platform_event.c if column.name != "data")
# Where an event's data sits in the request data, for the problems that point into it.
_DATA_PATH = "/event/data"


@dataclass(frozen=True)
class PlatformEvent:
    """An event as the platform sends it."""

    org: str
    id: str
    moment: str
    plan_id: str
    machine_id: str
    occurred_at: datetime | None = None
    data: Any = field(default_factory=dict)


@dataclass(frozen=True)
class Actor:
    """On whose behalf the started request runs: its owner and the execution's actor snapshot."""

    sub: str
    snapshot: dict[str, Any]

    @classmethod
    def platform(cls, org: str) -> Actor:
        return cls(PLATFORM_ACTOR, {"sub": PLATFORM_ACTOR, "org": org, "scopes": []})


@dataclass(frozen=True)
class EventAnswer:
    """What became of an event; the same every time the event is asked about."""

    event_id: str
    outcome: str
    request_id: uuid.UUID | None = None
    execution_id: uuid.UUID | None = None
    problems: list[Problem] = field(default_factory=list)
    # For NO_BINDING: PLAN_UNKNOWN or PLAN_UNBOUND (None for events recorded before).
    plan: str | None = None
    # The fields (API names) in which this delivery's body differs from the event
    # recorded under its id: another event reusing the id, which is not kept.
    differs_in: list[str] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return self.outcome == STARTED

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"eventId": self.event_id}
        if self.started:
            body |= {"requestId": str(self.request_id), "executionId": str(self.execution_id)}
        else:
            body |= {"started": False, "reason": self.outcome}
            if self.plan is not None:
                body["plan"] = self.plan
            if self.problems:
                body["problems"] = [p.as_dict() for p in self.problems]
        if self.differs_in:
            # The answer is the recorded event's, not this body's: say so where the
            # sender reads the answer (SPEC 17: a reused id is flagged).
            body["differsFromRecorded"] = list(self.differs_in)
        return body


def receive_event(
    engine: Engine, event: PlatformEvent, actor: Actor, *, max_attempts: int
) -> EventAnswer:
    """Record the event and process it, or answer what its first delivery started.

    The same id with the same body is the same event, answered alike every time. The
    same id with another body gets the recorded event's answer with `differs_in` naming
    the fields that differ: the recorded event stands, this body is not kept.
    """
    with engine.begin() as connection:
        # A concurrent delivery of the same id waits here on the unique key until the
        # first commits, then inserts nothing and reads the outcome below.
        connection.execute(
            insert(platform_event)
            .values(
                org_id=event.org,
                id=event.id,
                moment=event.moment,
                plan_id=event.plan_id,
                machine_id=event.machine_id,
                occurred_at=event.occurred_at,
                data=event.data,
            )
            .on_conflict_do_nothing(index_elements=["org_id", "id"])
        )
        # Data is compared as stored (jsonb equality), never loaded: see _EVENT_COLUMNS.
        same_data = platform_event.c.data == bindparam(
            "event_data", event.data, type_=platform_event.c.data.type
        )
        row = connection.execute(
            select(*_EVENT_COLUMNS, same_data.label("same_data"))
            .where(platform_event.c.org_id == event.org, platform_event.c.id == event.id)
            .with_for_update()
        ).one()
        if row.processed_at is None:
            # Ours, or the platform's own insert that no consumer has reached yet.
            answer = process_or_reject(connection, row, actor, max_attempts=max_attempts)
        else:
            answer = _recorded_answer(connection, row)
        differing = _differing_fields(row, event)
        return replace(answer, differs_in=differing) if differing else answer


def _differing_fields(row: Row, event: PlatformEvent) -> list[str]:
    """The fields in which a delivery differs from the event recorded under its id."""
    pairs = [
        ("moment", row.moment, event.moment),
        ("planId", row.plan_id, event.plan_id),
        ("machineId", row.machine_id, event.machine_id),
        ("occurredAt", row.occurred_at, event.occurred_at),
    ]
    differing = [name for name, stored, sent in pairs if stored != sent]
    if not row.same_data:
        differing.append("data")
    return differing


def claim_unprocessed(connection: Connection, limit: int) -> list[Row]:
    """Lock up to `limit` unprocessed events, oldest first, skipping those others hold."""
    return list(
        connection.execute(
            select(*_EVENT_COLUMNS)
            .where(platform_event.c.processed_at.is_(None))
            .order_by(platform_event.c.received_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )


def process_or_reject(
    connection: Connection, event: Row, actor: Actor, *, max_attempts: int
) -> EventAnswer:
    """Process a locked, unprocessed event in a savepoint; record it REJECTED if that fails.

    Any failure but a passing one of the database (`is_retriable`: the connection went
    away, a deadlock, a lock timeout) is the event's own and would recur on every
    attempt, so only the savepoint is rolled back and the event is set aside with why,
    in the caller's transaction; the events behind it go on. A passing failure is
    raised: the caller's whole transaction is lost and every event in it is there for
    the next attempt.
    """
    try:
        with connection.begin_nested():
            return process_event(connection, event, actor, max_attempts=max_attempts)
    except DBAPIError as error:
        if is_retriable(error) or connection.invalidated:
            raise
        cause = type(error.orig or error).__name__
        problem = Problem("", "the database refused the event's request")
    except Exception as error:
        if connection.invalidated:
            raise
        cause = type(error).__name__
        problem = Problem(
            "",
            f"the event could not be processed (an unexpected {cause}); "
            "it is set aside and will not be tried again",
        )
    # The class only: an exception's message may quote the event's data.
    log.error(
        "platform event could not be processed, rejected: %s",
        cause,
        extra={"org_id": event.org_id, "event_id": event.id},
    )
    return reject_event(connection, event, None, [problem])


def process_event(
    connection: Connection, event: Row, actor: Actor, *, max_attempts: int
) -> EventAnswer:
    """Start the bound flow for a locked, unprocessed event row and record the outcome.

    Failures other than the data's are raised: `process_or_reject` is the way in that
    turns them into a recorded refusal.
    """
    bound = connection.execute(
        select(flow.c.id, flow.c.definition, flow.c.data_schema)
        .select_from(
            hosting_plan.join(
                plan_flow_binding, plan_flow_binding.c.plan_id == hosting_plan.c.id
            ).join(
                flow, and_(flow.c.id == plan_flow_binding.c.flow_id, flow.c.org_id == event.org_id)
            )
        )
        .where(
            hosting_plan.c.org_id == event.org_id,
            hosting_plan.c.key == event.plan_id,
            plan_flow_binding.c.moment == event.moment,
        )
    ).one_or_none()
    if bound is None:
        return _not_bound(connection, event)
    definition = FlowDefinition.from_json(bound.definition)
    start = definition.transitions.get(definition.start or "")
    if start is None or not start.leaves(definition.initial_state):
        # A flow published before `start` was required: it cannot say what to run.
        problem = Problem(
            "/start", "the bound flow names no start transition leaving its initial state"
        )
        return reject_event(connection, event, bound.id, [problem])
    try:
        data = request_data(event, read_event_data(connection, event))
        validate_request_data(data, bound.data_schema, max_bytes=MAX_DATA_BYTES)
        if start.concurrency is not None:
            key_value(start.concurrency, data)  # before the request is written
    except DataValidationError as exc:
        return reject_event(connection, event, bound.id, exc.problems)
    except KeyMissing as missing:
        return reject_event(connection, event, bound.id, [missing.problem])
    # The execution's trace starts here (under the API request's, when one posted it).
    with tracing.span(
        "event.start", {"orquestador.event_id": event.id, "orquestador.moment": event.moment}
    ):
        created = insert_request(
            connection,
            org=event.org_id,
            owner=actor.sub,
            flow_row=bound,
            data=data,
            machine_id=event.machine_id,
        )
        execution_id = queue_execution(
            connection,
            request_row=created,
            definition=definition,
            transition_id=start.id,
            actor=actor.sub,
            actor_snapshot=actor.snapshot,
            max_attempts=max_attempts,
            started_by={
                "event": event.id,
                "moment": event.moment,
                "plan": event.plan_id,
                "occurredAt": data["event"]["occurredAt"],
            },
        )
    answer = EventAnswer(event.id, STARTED, request_id=created.id, execution_id=execution_id)
    log.info(
        "platform event started its flow",
        extra={"request_id": str(created.id), "execution_id": str(execution_id)},
    )
    return _record(connection, event, answer)


def read_event_data(connection: Connection, event: Row) -> Any:
    """The event's stored data, or `DataValidationError` saying why it cannot be used.

    The data is fetched as text, and only when that text is not too large, then parsed
    here with bounds of our own, so that a document the driver could not load becomes a
    problem at `/event/data` rather than an exception that fails the event's batch.
    """
    stored_text = cast(platform_event.c.data, Text)
    size = func.octet_length(stored_text)
    stored = connection.execute(
        select(
            size.label("size"),
            case((size <= MAX_EVENT_DATA_TEXT_BYTES, stored_text)).label("text"),
        ).where(platform_event.c.org_id == event.org_id, platform_event.c.id == event.id)
    ).one()
    if stored.text is None:
        reason = (
            f"is {stored.size} bytes as stored, more than the request data may hold "
            f"({MAX_DATA_BYTES} bytes as JSON)"
        )
        raise DataValidationError([Problem(_DATA_PATH, reason)])
    try:
        return json.loads(stored.text, parse_int=_whole_number, parse_float=_finite_number)
    except RecursionError:
        # Python's reader gives up about a thousand levels down, far past the limit.
        reason = f"nests deeper than {MAX_DATA_DEPTH} levels"
        raise DataValidationError([Problem(_DATA_PATH, reason)]) from None
    except _UnreadableNumber as exc:
        raise DataValidationError([Problem(_DATA_PATH, str(exc))]) from None


class _UnreadableNumber(ValueError):
    """A number in stored data that has no faithful Python value."""


def _whole_number(text: str) -> int:
    # int() refuses more digits than the interpreter's limit (4300 by default) with a
    # message about sys settings; say what is wrong with the data instead.
    digits = len(text) - text.startswith("-")
    limit = sys.get_int_max_str_digits()
    if limit and digits > limit:
        raise _UnreadableNumber(f"holds a number of {digits} digits; at most {limit} are read")
    return int(text)


def _finite_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _UnreadableNumber("holds a number too large for a double-precision float")
    return value


def request_data(event: Row, event_data: Any) -> dict[str, Any]:
    """The request data of a moment-triggered flow (SPEC: machineId, planId, event)."""
    occurred = event.occurred_at or event.received_at
    return {
        "machineId": event.machine_id,
        "planId": event.plan_id,
        "event": {
            "id": event.id,
            "moment": event.moment,
            "occurredAt": occurred.isoformat(),
            "data": event_data,
        },
    }


def _not_bound(connection: Connection, event: Row) -> EventAnswer:
    """Record NO_BINDING, and in an audit row whether the plan is unknown or merely unbound."""
    known = connection.scalar(
        select(
            exists().where(
                hosting_plan.c.org_id == event.org_id, hosting_plan.c.key == event.plan_id
            )
        )
    )
    plan = PLAN_UNBOUND if known else PLAN_UNKNOWN
    connection.execute(
        audit_event.insert().values(
            org_id=event.org_id,
            kind=NOT_BOUND_KIND,
            actor=None,
            detail={
                "eventId": event.id,
                "planId": event.plan_id,
                "moment": event.moment,
                "plan": plan,
            },
        )
    )
    return _record(connection, event, EventAnswer(event.id, NO_BINDING, plan=plan))


def reject_event(
    connection: Connection, event: Row, flow_id: uuid.UUID | None, problems: list[Problem]
) -> EventAnswer:
    """Record the event REJECTED, keeping why in an audit row its later answers read."""
    connection.execute(
        audit_event.insert().values(
            org_id=event.org_id,
            kind=REJECTED_KIND,
            actor=None,
            detail={
                "eventId": event.id,
                "flowId": None if flow_id is None else str(flow_id),
                "problems": [p.as_dict() for p in problems],
            },
        )
    )
    return _record(connection, event, EventAnswer(event.id, REJECTED, problems=list(problems)))


def _record(connection: Connection, event: Row, answer: EventAnswer) -> EventAnswer:
    connection.execute(
        platform_event.update()
        .where(platform_event.c.org_id == event.org_id, platform_event.c.id == event.id)
        .values(
            outcome=answer.outcome,
            request_id=answer.request_id,
            execution_id=answer.execution_id,
            processed_at=func.clock_timestamp(),
        )
    )
    return answer


def _recorded_detail(connection: Connection, event: Row, kind: str) -> dict[str, Any]:
    """The detail of the first audit row of `kind` about this event, or {}."""
    detail = connection.execute(
        select(audit_event.c.detail)
        .where(
            audit_event.c.org_id == event.org_id,
            audit_event.c.kind == kind,
            audit_event.c.detail["eventId"].astext == event.id,
        )
        .order_by(audit_event.c.id)
        .limit(1)
    ).scalar_one_or_none()
    return detail or {}


def _recorded_answer(connection: Connection, event: Row) -> EventAnswer:
    problems: list[Problem] = []
    plan: str | None = None
    if event.outcome == REJECTED:
        detail = _recorded_detail(connection, event, REJECTED_KIND)
        problems = [Problem(p["path"], p["message"]) for p in detail.get("problems", [])]
    elif event.outcome == NO_BINDING:
        plan = _recorded_detail(connection, event, NOT_BOUND_KIND).get("plan")
    return EventAnswer(
        event.id,
        event.outcome,
        request_id=event.request_id,
        execution_id=event.execution_id,
        problems=problems,
        plan=plan,
    )
