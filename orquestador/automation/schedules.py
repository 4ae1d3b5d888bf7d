"""The schedules store: a schedule per caller's id in an organization, put whole and read back,
and what each fire starts: which flow version, which transition, with which request data.

A schedule names its flow by key (each fire starts the key's latest version) or by a
version's id (each fire starts that version), and the transition each fire accepts on a
new request: a `schedule` flow's `start` by default, with the request data `{scheduleId,
fireTime, data}`; any other flow's named transition (or its `start`), with the
schedule's data as the request data. The request names the machine the data names
(`machineId`), so a schedule's executions keep their machine like any other.

Every statement names the organization, so another organization's schedule or flow is
indistinguishable from a missing one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select, text
from sqlalchemy.dialects.postgresql import insert

from orquestador.db.schema import flow, schedule
from orquestador.domain.concurrency import KeyMissing, key_value
from orquestador.domain.errors import DataValidationError
from orquestador.domain.flow_definition import SCHEDULE_TRIGGER, FlowDefinition, Transition
from orquestador.domain.limits import MAX_DATA_BYTES
from orquestador.domain.pointer_updates import validate_request_data
from orquestador.domain.schedule_times import Timing
from orquestador.errors import Problem, Refusal

# The caller's schedule ids arrive in URLs; bounded like the other ids.
MAX_SCHEDULE_ID_CHARACTERS = 200
# Refusals' codes, stable: the API answers each with 422.
TRANSITION_INVALID = "SCHEDULE_TRANSITION_INVALID"
CONCURRENCY_KEY_MISSING = "CONCURRENCY_KEY_MISSING"
DATA_INVALID = "DATA_INVALID"


@dataclass(frozen=True)
class ScheduleSpec:
    """What PUT /schedules/{id} says a schedule is."""

    # A flow key (its latest version at each fire) or a flow version's id.
    flow: str
    timing: Timing
    data: dict[str, Any]
    catch_up: str
    paused: bool
    # The transition each fire accepts; None: the flow's `start`.
    transition: str | None = None


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored, with where its firing stands."""

    key: str
    spec: ScheduleSpec
    # The flow version it was put with (the one it fires, when named by id).
    flow_id: uuid.UUID
    # The flow's key when named by key: each fire takes the key's latest version.
    flow_key: str | None
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    missed: int
    created_at: datetime
    updated_at: datetime


class FlowNotFound(Refusal):
    """No flow of the organization has this key or id."""

    code = Refusal.NOT_FOUND


class QuotaExceeded(Refusal):
    """The organization's quota does not allow this: `quota` names it, `limit` is its limit."""

    code = "QUOTA_EXCEEDED"

    def __init__(self, quota: str, limit: int, used: int) -> None:
        super().__init__(
            f"The organization's quota {quota} ({limit}) allows no more.",
            problems=[Problem("", f"quota {quota}: {used} of {limit}")],
        )
        self.quota = quota
        self.limit = limit
        self.used = used

    @property
    def detail(self) -> str:
        return f"{self.message} Delete a schedule, or ask the operator to raise the quota."


# Creations of one organization's schedules take turns (a lock for the transaction), so
# two at once cannot both find the last place free; the count and its comparison with
# the limit are one statement.
_SCHEDULES_QUOTA = text(
    """
    WITH turn AS (
        SELECT pg_advisory_xact_lock(hashtext('orquestador schedule quota'), hashtext(:org))
    )
    SELECT count(s.id) AS used, count(s.id) < :limit AS room
    FROM turn LEFT JOIN schedule s ON s.org_id = :org
    """
)


def require_schedule_room(connection: Connection, *, org: str, limit: int) -> None:
    """QuotaExceeded unless the organization may create one more schedule."""
    used, room = connection.execute(_SCHEDULES_QUOTA, {"org": org, "limit": limit}).one()
    if not room:
        raise QuotaExceeded("schedules", limit, used)


class ScheduleRefused(Refusal):
    """The schedule cannot be put (or fired) as asked: `code` and the problems say why."""

    def __init__(self, code: str, message: str, problems: list[Problem]) -> None:
        super().__init__(message, code=code, problems=problems)


def schedule_id_problem(key: str) -> str | None:
    """Why a schedule id is refused, or None."""
    if not key or len(key) > MAX_SCHEDULE_ID_CHARACTERS:
        return f"a schedule id has 1 to {MAX_SCHEDULE_ID_CHARACTERS} characters"
    if not key.isprintable():
        return "a schedule id has only printable characters"
    return None


def fire_data(key: str, fire_time: str, data: Any) -> dict[str, Any]:
    """The request data of a `schedule` flow's fire (SPEC: scheduleId, fireTime, data)."""
    return {"scheduleId": key, "fireTime": fire_time, "data": data}


_FLOW_COLUMNS = (
    flow.c.id,
    flow.c.key,
    flow.c.version,
    flow.c.trigger,
    flow.c.definition,
    flow.c.data_schema,
)


def resolve_flow(connection: Connection, *, org: str, named: str) -> tuple[Row, str | None]:
    """The flow version a schedule's `flow` names, and its key when named by key.

    A version id names that version; anything else is a key, whose latest version it
    names. FlowNotFound when the organization has neither.
    """
    try:
        version = uuid.UUID(named)
    except ValueError:
        version = None
    if version is not None:
        row = connection.execute(
            select(*_FLOW_COLUMNS).where(flow.c.id == version, flow.c.org_id == org)
        ).one_or_none()
        if row is not None:
            return row, None
    row = latest_version(connection, org=org, key=named)
    if row is None:
        raise FlowNotFound()
    return row, named


def latest_version(connection: Connection, *, org: str, key: str) -> Row | None:
    return connection.execute(
        select(*_FLOW_COLUMNS)
        .where(flow.c.org_id == org, flow.c.key == key)
        .order_by(flow.c.version.desc())
        .limit(1)
    ).one_or_none()


@dataclass(frozen=True)
class Start:
    """What one fire accepts: the transition, the request data, the machine it names."""

    transition: Transition
    data: dict[str, Any]
    machine_id: str | None


def start_of(
    flow_row: Row, *, key: str, transition: str | None, fire_time: str, data: Any
) -> Start:
    """The fire of this flow version at `fire_time`, checked as an acceptance is.

    ScheduleRefused when the transition does not start from the flow's initial state (a
    fire's request is new), or the flow's data schema or concurrency key refuses the data.
    Problem paths are in the schedule's terms (`/transition`, `/data/...`).
    """
    definition = FlowDefinition.from_json(flow_row.definition)
    chosen = definition.transitions.get(transition or definition.start or "")
    if chosen is None or definition.initial_state not in chosen.from_states:
        raise ScheduleRefused(
            TRANSITION_INVALID,
            "A fire starts a new request: the transition must leave the flow's initial state.",
            [
                Problem(
                    "/transition",
                    f"the flow has no transition {transition!r} from {definition.initial_state!r}"
                    if transition
                    else "the flow has no `start`: name the transition each fire starts",
                )
            ],
        )
    wrapped = flow_row.trigger == SCHEDULE_TRIGGER
    request_data = fire_data(key, fire_time, data) if wrapped else data
    try:
        validate_request_data(request_data, flow_row.data_schema, max_bytes=MAX_DATA_BYTES)
        if chosen.concurrency is not None:
            key_value(chosen.concurrency, request_data)
    except DataValidationError as invalid:
        raise ScheduleRefused(
            DATA_INVALID,
            "The flow's dataSchema refuses the request data a fire would give it.",
            [_in_schedule_terms(p, wrapped) for p in invalid.problems],
        ) from None
    except KeyMissing as missing:
        raise ScheduleRefused(
            CONCURRENCY_KEY_MISSING,
            "The transition declares a concurrency key the fire's data does not give.",
            [_in_schedule_terms(missing.problem, wrapped)],
        ) from None
    named = data.get("machineId") if isinstance(data, dict) else None
    return Start(chosen, request_data, named if isinstance(named, str) and named else None)


def _in_schedule_terms(problem: Problem, wrapped: bool) -> Problem:
    # A schedule flow's request keeps the schedule's data under /data already.
    return problem if wrapped else Problem(f"/data{problem.path}", problem.message)


def put_schedule(
    connection: Connection,
    *,
    org: str,
    key: str,
    spec: ScheduleSpec,
    actor: str,
    max_schedules: int | None = None,
) -> tuple[Schedule, bool]:
    """Create or replace the schedule; return it and whether it was created.

    `FlowNotFound` when the organization has no such flow; `ScheduleRefused` when a fire
    of it could not start (the transition, the data). The next fire time is kept when the
    timing did not change and the schedule was and stays running; otherwise it is the
    first fire time after now (none while paused): changing when a schedule fires, or
    resuming it, never makes up for fire times before the change. `max_schedules`: the
    organization's quota, checked when the schedule is new (QuotaExceeded).
    """
    flow_row, flow_key = resolve_flow(connection, org=org, named=spec.flow)
    now: datetime = connection.scalar(select(func.clock_timestamp()))
    start_of(
        flow_row,
        key=key,
        transition=spec.transition,
        fire_time=spec.timing.local(now).isoformat(),
        data=spec.data,
    )
    current = connection.execute(
        select(schedule).where(schedule.c.org_id == org, schedule.c.id == key).with_for_update()
    ).one_or_none()
    if current is None and max_schedules is not None:
        require_schedule_room(connection, org=org, limit=max_schedules)
    next_fire_at: datetime | None
    if spec.paused:
        next_fire_at = None
    elif current is not None and not current.paused and _same_timing(current, spec.timing):
        next_fire_at = current.next_fire_at
    else:
        next_fire_at = spec.timing.first_after(now)
    values = {
        "flow_id": flow_row.id,
        "flow_key": flow_key,
        "flow_trigger": flow_row.trigger,
        "transition_id": spec.transition,
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
    written = connection.execute(
        statement.on_conflict_do_update(
            index_elements=[schedule.c.org_id, schedule.c.id], set_=values
        ).returning(*schedule.c)
    ).one()
    return schedule_of(written), current is None


def set_paused(
    connection: Connection, *, org: str, key: str, paused: bool, actor: str
) -> Schedule | None:
    """Pause or resume the schedule as it is; None when the organization has no such one.

    Resuming starts from the first fire time after now, as putting it again would.
    """
    current = find_schedule(connection, org=org, key=key)
    if current is None:
        return None
    if current.spec.paused == paused:
        return current
    spec = ScheduleSpec(
        flow=current.flow_key or str(current.flow_id),
        timing=current.spec.timing,
        data=current.spec.data,
        catch_up=current.spec.catch_up,
        paused=paused,
        transition=current.spec.transition,
    )
    found, _ = put_schedule(connection, org=org, key=key, spec=spec, actor=actor)
    return found


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
    return None if row is None else schedule_of(row)


def list_schedules(connection: Connection, *, org: str, limit: int) -> list[Schedule]:
    """The organization's schedules by id, at most `limit`."""
    rows = connection.execute(
        select(schedule).where(schedule.c.org_id == org).order_by(schedule.c.id).limit(limit)
    )
    return [schedule_of(row) for row in rows]


def delete_schedule(connection: Connection, *, org: str, key: str) -> bool:
    """Delete the schedule and its fire rows (its requests and executions stay)."""
    deleted = connection.execute(
        schedule.delete()
        .where(schedule.c.org_id == org, schedule.c.id == key)
        .returning(schedule.c.id)
    ).first()
    return deleted is not None


def schedule_of(row: Row) -> Schedule:
    """A schedule row as the store hands it out."""
    return Schedule(
        key=row.id,
        spec=ScheduleSpec(
            flow=row.flow_key or str(row.flow_id),
            timing=Timing(row.cron, row.every_seconds, row.timezone),
            data=row.data,
            catch_up=row.catch_up,
            paused=row.paused,
            transition=row.transition_id,
        ),
        flow_id=row.flow_id,
        flow_key=row.flow_key,
        next_fire_at=row.next_fire_at,
        last_fired_at=row.last_fired_at,
        missed=row.missed,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )
