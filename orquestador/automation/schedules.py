"""The schedules store: a schedule per caller's id in an organization, put whole and read back.

Every statement names the organization, so another organization's schedule or flow is
indistinguishable from a missing one. The schema, not only this code, refuses a flow whose
trigger is not `schedule` (a composite foreign key to flow (id, trigger)).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError

from orquestador.db.schema import flow, schedule
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.errors import DataValidationError, Problem
from orquestador.domain.flow_definition import SCHEDULE_TRIGGER, FlowDefinition
from orquestador.domain.limits import MAX_DATA_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.domain.schedule_times import Timing

# The caller's schedule ids arrive in URLs; bounded like the other ids.
MAX_SCHEDULE_ID_CHARACTERS = 200
# Refusals' codes, stable: the API answers each with 422.
TRIGGER_MISMATCH = "SCHEDULE_TRIGGER_MISMATCH"
CONCURRENCY_KEY_MISSING = "CONCURRENCY_KEY_MISSING"
DATA_INVALID = "DATA_INVALID"
# SQLSTATE of a foreign key violation.
_FOREIGN_KEY_VIOLATION = "23503"


@dataclass(frozen=True)
class ScheduleSpec:
    """What PUT /schedules/{id} says a schedule is."""

    flow_id: uuid.UUID
    timing: Timing
    data: dict[str, Any]
    catch_up: str
    paused: bool


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored, with where its firing stands."""

    key: str
    spec: ScheduleSpec
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    missed: int
    created_at: datetime
    updated_at: datetime


class FlowNotFound(Exception):
    """No flow of the organization has this id."""


class ScheduleRefused(Exception):
    """The schedule cannot be put as asked: `code` and the problems say why."""

    def __init__(self, code: str, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.code = code
        self.problems = problems


def schedule_id_problem(key: str) -> str | None:
    """Why a schedule id is refused, or None."""
    if not key or len(key) > MAX_SCHEDULE_ID_CHARACTERS:
        return f"a schedule id has 1 to {MAX_SCHEDULE_ID_CHARACTERS} characters"
    if not key.isprintable():
        return "a schedule id has only printable characters"
    return None


def fire_data(key: str, fire_time: str, data: Any) -> dict[str, Any]:
    """The request data of a schedule's fire (SPEC: scheduleId, fireTime, data)."""
    return {"scheduleId": key, "fireTime": fire_time, "data": data}


def put_schedule(
    connection: Connection, *, org: str, key: str, spec: ScheduleSpec, actor: str
) -> tuple[Schedule, bool]:
    """Create or replace the schedule; return it and whether it was created.

    `FlowNotFound` when the organization has no such flow; `ScheduleRefused` when the flow
    is not a schedule flow or would refuse the request data a fire gives it. The next fire
    time is kept when the timing did not change and the schedule was and stays running;
    otherwise it is the first fire time after now (none while paused): changing when a
    schedule fires, or resuming it, never makes up for fire times before the change.
    """
    flow_row = connection.execute(
        select(flow.c.id, flow.c.trigger, flow.c.definition, flow.c.data_schema).where(
            flow.c.id == spec.flow_id, flow.c.org_id == org
        )
    ).one_or_none()
    if flow_row is None:
        raise FlowNotFound()
    now: datetime = connection.scalar(select(func.clock_timestamp()))
    _check_flow(flow_row, key, spec, spec.timing.local(now).isoformat())
    current = connection.execute(
        select(schedule).where(schedule.c.org_id == org, schedule.c.id == key).with_for_update()
    ).one_or_none()
    next_fire_at: datetime | None
    if spec.paused:
        next_fire_at = None
    elif current is not None and not current.paused and _same_timing(current, spec.timing):
        next_fire_at = current.next_fire_at
    else:
        next_fire_at = spec.timing.first_after(now)
    values = {
        "flow_id": spec.flow_id,
        "cron": spec.timing.cron,
        "every_seconds": spec.timing.every_seconds,
        "timezone": spec.timing.timezone,
        "data": spec.data,
        "catch_up": spec.catch_up,
        "paused": spec.paused,
        "next_fire_at": next_fire_at,
        # Put anew, a schedule a failed round set aside is tried again at once.
        "retry_at": None,
        "updated_by": actor,
        "updated_at": now,
    }
    statement = insert(schedule).values(org_id=org, id=key, **values)
    try:
        written = connection.execute(
            statement.on_conflict_do_update(
                index_elements=[schedule.c.org_id, schedule.c.id], set_=values
            ).returning(*schedule.c)
        ).one()
    except IntegrityError as error:
        # The flow's trigger changed under us is impossible (flows are immutable): this
        # is the schema's own check, kept as the last word.
        if getattr(error.orig, "sqlstate", None) == _FOREIGN_KEY_VIOLATION:
            raise _trigger_mismatch() from None
        raise
    return _schedule(written), current is None


def _check_flow(flow_row: Row, key: str, spec: ScheduleSpec, sample_fire_time: str) -> None:
    if flow_row.trigger != SCHEDULE_TRIGGER:
        raise _trigger_mismatch()
    definition = FlowDefinition.from_json(flow_row.definition)
    start = definition.transitions.get(definition.start or "")
    data = fire_data(key, sample_fire_time, spec.data)
    try:
        validate_request_data(data, flow_row.data_schema, max_bytes=MAX_DATA_BYTES)
        if start is not None and start.concurrency is not None:
            key_value(start.concurrency, data)
    except DataValidationError as invalid:
        raise ScheduleRefused(
            DATA_INVALID,
            "The flow's dataSchema refuses the request data a fire would give it.",
            invalid.problems,
        ) from None
    except KeyMissing as missing:
        raise ScheduleRefused(
            CONCURRENCY_KEY_MISSING,
            "The flow's start transition declares a concurrency key the fire's data does not give.",
            [missing.problem],
        ) from None


def _trigger_mismatch() -> ScheduleRefused:
    return ScheduleRefused(
        TRIGGER_MISMATCH,
        "Only a flow whose trigger is 'schedule' can be scheduled.",
        [Problem("/flowId", "the flow's trigger is not 'schedule'")],
    )


def _same_timing(row: Row, timing: Timing) -> bool:
    return (row.cron, row.every_seconds, row.timezone) == (
        timing.cron,
        timing.every_seconds,
        timing.timezone,
    )


def find_schedule(connection: Connection, *, org: str, key: str) -> Schedule | None:
    row = connection.execute(
        select(schedule).where(schedule.c.org_id == org, schedule.c.id == key)
    ).one_or_none()
    return None if row is None else _schedule(row)


def list_schedules(connection: Connection, *, org: str, limit: int) -> list[Schedule]:
    """The organization's schedules by id, at most `limit`."""
    rows = connection.execute(
        select(schedule).where(schedule.c.org_id == org).order_by(schedule.c.id).limit(limit)
    )
    return [_schedule(row) for row in rows]


def delete_schedule(connection: Connection, *, org: str, key: str) -> bool:
    """Delete the schedule and its fire rows (its requests and executions stay)."""
    deleted = connection.execute(
        schedule.delete()
        .where(schedule.c.org_id == org, schedule.c.id == key)
        .returning(schedule.c.id)
    ).first()
    return deleted is not None


def _schedule(row: Row) -> Schedule:
    return Schedule(
        key=row.id,
        spec=ScheduleSpec(
            flow_id=row.flow_id,
            timing=Timing(row.cron, row.every_seconds, row.timezone),
            data=row.data,
            catch_up=row.catch_up,
            paused=row.paused,
        ),
        next_fire_at=row.next_fire_at,
        last_fired_at=row.last_fired_at,
        missed=row.missed,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
