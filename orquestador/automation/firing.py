"""Firing schedules: each fire time of a schedule starts its flow once, whatever the workers.

A round locks due schedules with SKIP LOCKED (workers share them without waiting on each
other), taken in turns across organizations (each one's earliest due schedule before
anyone's second: one organization's flood never makes another's schedule miss), decides
under the schedule's catch-up policy which passed fire times to start
(`domain.schedule_times.plan_round`), and for each writes, in the same transaction, the
fire row, the request, the accepted execution of the flow's `start` transition (through
`queue.acceptance`, as platform events do) and the schedule's next fire time. A person's
"run now" is one more fire, at the present instant, through the same path. The fire
row's key (organization, schedule, fire time) is what makes a fire time start at most
one execution: a round that finds it written starts nothing for it. A crash anywhere
before COMMIT leaves none of it, and the schedule is still due for the next round.

A fire over the organization's quota openExecutions is put off, not started: its fire
time stays the schedule's next one and the schedule is looked at again after
QUOTA_RETRY_AFTER. A fire time waits so only until the schedule's following fire time
passes; then it is missed (counted in the schedule's `missed` and the metric's outcome
`missed`), as are any older ones the catch-up policy would have started.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, Select, and_, func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError

from orquestador import tracing
from orquestador.automation.schedules import (
    FlowNotFound,
    ScheduleRefused,
    latest_version,
    resolve_flow,
    start_of,
)
from orquestador.db.engine import is_retriable
from orquestador.db.schema import audit_event, schedule, schedule_fire
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.schedule_times import Round, Timing, plan_round
from orquestador.errors import Problem
from orquestador.loop import Loop
from orquestador.metrics import SCHEDULE_FIRES_TOTAL
from orquestador.queue.acceptance import insert_request, queue_execution
from orquestador.queue.open_executions import RecentRoom

log = logging.getLogger(__name__)

# A fire time waits at most about this long for an idle worker; the query behind a
# round reads the partial index of running schedules, so polling this often costs little.
POLL_SECONDS = 1.0
# Schedules per round (one transaction); each starts at most FIRES_PER_ROUND fires.
BATCH_SIZE = 10
# A schedule whose round failed in a way of its own is looked at again after this long
# (its fire times unchanged), so it never stands in front of the others.
RETRY_AFTER_FAILURE = timedelta(minutes=1)
# A schedule whose fire the organization's quota openExecutions put off is looked at
# again after this long (its executions end at their own pace).
QUOTA_RETRY_AFTER = timedelta(seconds=5)
# The audit row that keeps why a fire started nothing.
FIRE_REJECTED_KIND = "SCHEDULE_FIRE_REJECTED"
# What became of a fire time (the outcomes of orquestador_schedule_fires_total).
STARTED, MISSED, REFUSED = "started", "missed", "refused"
# Fire times a round handled, by outcome; counted into the metric once the round commits.
Outcomes = Counter[str]
# An organization's quota openExecutions (Settings.quotas_for(org).open_executions).
OpenLimit = Callable[[str], int]


class _Room:
    """Whether each organization may start one more execution, within one round.

    Asked of the worker's RecentRoom for each fire (counted near the limit, the round's
    own fires included as its transaction sees them; far below it, at most once a
    second), except for an organization found full: a round only adds executions, so it
    stays full until the round ends.
    """

    def __init__(
        self, connection: Connection, open_limit: OpenLimit | None, recent: RecentRoom
    ) -> None:
        self._connection = connection
        self._open_limit = open_limit
        self._recent = recent
        self._full: set[str] = set()

    def for_one_more(self, org: str) -> bool:
        if self._open_limit is None:
            return True
        if org in self._full:
            return False
        limit = self._open_limit(org)
        if self._recent.used_if_full(self._connection, org, limit) is None:
            return True
        self._full.add(org)
        return False


def fire_due_schedules(
    engine: Engine,
    *,
    max_attempts: int,
    batch_size: int = BATCH_SIZE,
    now: datetime | None = None,
    open_limit: OpenLimit | None = None,
    recent: RecentRoom | None = None,
) -> bool:
    """Fire the passed fire times of up to `batch_size` due schedules in one transaction.

    True when more may be due at once (a full batch, or a schedule still behind). `now`
    is the database's clock; a test may pass another to stand at a chosen instant.
    `open_limit`: each organization's quota openExecutions (None: no quota); `recent`,
    the worker's memory of the organizations far below it.
    """
    with engine.begin() as connection:
        if now is None:
            now = connection.scalar(select(func.clock_timestamp()))
        assert now is not None
        due = connection.execute(_due_in_turns(now, batch_size)).all()
        more = len(due) == batch_size
        outcomes: Outcomes = Counter()
        room = _Room(connection, open_limit, recent or RecentRoom())
        for row in due:
            more |= _fire_or_put_off(
                connection, row, now, outcomes, room, max_attempts=max_attempts
            )
    for outcome, count in outcomes.items():
        SCHEDULE_FIRES_TOTAL.labels(outcome=outcome).inc(count)
    return more


def _is_due(table: Any, now: datetime) -> Any:
    return and_(
        ~table.c.paused,
        table.c.next_fire_at.is_not(None),
        table.c.next_fire_at <= now,
        or_(table.c.retry_at.is_(None), table.c.retry_at <= now),
    )


def _due_in_turns(now: datetime, batch_size: int) -> Select[Any]:
    """The round's due schedules, taken in turns across organizations, locked.

    Round robin: each organization's earliest due schedule comes before anyone's second,
    so one organization's thousand due schedules never push another's out of a round
    (only more organizations with due schedules than a round holds can). The turns are
    counted in a subquery without locks (no window function may sit beside FOR UPDATE);
    the outer SELECT re-checks that each row is still due as it locks it, and skips the
    rows another worker's round holds.
    """
    ranked = (
        select(
            schedule.c.org_id,
            schedule.c.id,
            func.row_number()
            .over(
                partition_by=schedule.c.org_id,
                order_by=(schedule.c.next_fire_at, schedule.c.id),
            )
            .label("turn"),
        )
        .where(_is_due(schedule, now))
        .subquery()
    )
    return (
        select(schedule)
        .join(ranked, and_(ranked.c.org_id == schedule.c.org_id, ranked.c.id == schedule.c.id))
        .where(_is_due(schedule, now))
        .order_by(ranked.c.turn, schedule.c.next_fire_at, schedule.c.org_id)
        .limit(batch_size)
        .with_for_update(of=schedule, skip_locked=True)
    )


def _fire_or_put_off(
    connection: Connection,
    row: Row,
    now: datetime,
    outcomes: Outcomes,
    room: _Room,
    *,
    max_attempts: int,
) -> bool:
    """Fire one locked schedule in a savepoint; on a failure of its own, look again later.

    A passing database failure is raised: the round is lost and every schedule in it is
    due again for the next.
    """
    try:
        with connection.begin_nested():
            counted: Outcomes = Counter()
            more = _fire(connection, row, now, counted, room, max_attempts=max_attempts)
        outcomes.update(counted)
        return more
    except DBAPIError as error:
        if is_retriable(error) or connection.invalidated:
            raise
        cause = type(error.orig or error).__name__
    except Exception as error:
        if connection.invalidated:
            raise
        cause = type(error).__name__
    log.error(
        "schedule could not be fired (%s); trying again in %s",
        cause,
        RETRY_AFTER_FAILURE,
        extra={"org_id": row.org_id, "schedule_id": row.id},
    )
    connection.execute(
        schedule.update()
        .where(schedule.c.org_id == row.org_id, schedule.c.id == row.id)
        .values(retry_at=now + RETRY_AFTER_FAILURE)
    )
    return False


def _fire(
    connection: Connection,
    row: Row,
    now: datetime,
    outcomes: Outcomes,
    room: _Room,
    *,
    max_attempts: int,
) -> bool:
    timing = Timing(row.cron, row.every_seconds, row.timezone)
    planned = plan_round(timing, row.catch_up, row.next_fire_at, now)
    fired: list[datetime] = []
    next_fire_at, missed, more = planned.next_fire_at, planned.missed, planned.more
    retry_at: datetime | None = None
    for n, fire_time in enumerate(planned.fire):
        if not room.for_one_more(row.org_id):
            next_fire_at, held, more = _put_off(planned.fire[n:], planned)
            missed += len(planned.fire[n:]) - (held is not None)
            retry_at = None if held is None else now + QUOTA_RETRY_AFTER
            log.info(
                "schedule fire put off: the organization's quota openExecutions is used up",
                extra={"org_id": row.org_id, "schedule_id": row.id},
            )
            break
        outcome = fire_once(connection, row, timing, fire_time, max_attempts)
        if outcome is not None:
            outcomes[outcome] += 1
        if outcome == STARTED:
            fired.append(fire_time)
    outcomes[MISSED] += missed
    connection.execute(
        schedule.update()
        .where(schedule.c.org_id == row.org_id, schedule.c.id == row.id)
        .values(
            next_fire_at=next_fire_at,
            missed=schedule.c.missed + missed,
            last_fired_at=fired[-1] if fired else schedule.c.last_fired_at,
            retry_at=retry_at,
        )
    )
    if missed:
        log.info(
            "schedule let %d fire times go (catch-up policy %r, or over a quota)",
            missed,
            row.catch_up,
            extra={"org_id": row.org_id, "schedule_id": row.id},
        )
    return more


def _put_off(
    unstarted: list[datetime], planned: Round
) -> tuple[datetime | None, datetime | None, bool]:
    """Over the quota: (the schedule's next fire time, the fire time held, more due now).

    A fire time waits while its window is open: until the schedule's following fire time.
    Only the latest due one is still in it (the round's last, unless the round stopped
    short of the latest due: `planned.more`); it is held, staying the schedule's next
    fire time, and every other unstarted one is missed.
    """
    if planned.more:
        return planned.next_fire_at, None, True
    return unstarted[-1], unstarted[-1], False


def fire_once(
    connection: Connection, row: Row, timing: Timing, fire_time: datetime, max_attempts: int
) -> str | None:
    """Start the schedule's flow for one fire time: STARTED, REFUSED by the flow, or None
    when that fire time was handled already.

    The fire row is written first: its key makes a second writer of the same fire time
    insert nothing (and wait, while the first is uncommitted, for its outcome).
    """
    if not _claim_fire_time(connection, row, fire_time):
        return None
    try:
        _start(
            connection,
            row,
            timing,
            fire_time,
            owner=row.updated_by,
            actor=row.updated_by,
            started_by={"schedule": row.id, "fireTime": fire_time.isoformat()},
            max_attempts=max_attempts,
        )
    except (ScheduleRefused, FlowNotFound) as refused:
        _reject(connection, row, fire_time, _problems_of(refused))
        return REFUSED
    return STARTED


@dataclass(frozen=True)
class Fired:
    """What one fire started."""

    fire_time: datetime
    request_id: uuid.UUID
    execution_id: uuid.UUID


def run_now(
    connection: Connection, *, org: str, key: str, actor: str, max_attempts: int
) -> Fired | None:
    """Fire the schedule once now, for a person who asked (paused or not); None when the
    organization has no such schedule.

    The fire is the database's present instant, recorded like any fire time (so its
    execution is listed with the schedule's). Its request is owned by the schedule's
    author, like every fire's, and its execution is `actor`'s: neither may approve what
    it started. ScheduleRefused or FlowNotFound when the flow refuses it: then nothing
    is written.
    """
    row = connection.execute(
        select(schedule).where(schedule.c.org_id == org, schedule.c.id == key)
    ).one_or_none()
    if row is None:
        return None
    fire_time: datetime = connection.scalar(select(func.clock_timestamp()))
    timing = Timing(row.cron, row.every_seconds, row.timezone)
    if not _claim_fire_time(connection, row, fire_time):
        raise RuntimeError("a fire time of this very instant was handled already")
    return _start(
        connection,
        row,
        timing,
        fire_time,
        owner=row.updated_by,
        actor=actor,
        started_by={"schedule": row.id, "fireTime": fire_time.isoformat(), "by": actor},
        max_attempts=max_attempts,
    )


def _claim_fire_time(connection: Connection, row: Row, fire_time: datetime) -> bool:
    claimed = connection.execute(
        insert(schedule_fire)
        .values(org_id=row.org_id, schedule_id=row.id, fire_time=fire_time)
        .on_conflict_do_nothing()
        .returning(schedule_fire.c.fire_time)
    ).first()
    return claimed is not None


def _start(
    connection: Connection,
    row: Row,
    timing: Timing,
    fire_time: datetime,
    *,
    owner: str,
    actor: str,
    started_by: dict[str, Any],
    max_attempts: int,
) -> Fired:
    """The request and its accepted execution for one claimed fire time, and its record.

    The flow version is the one the schedule names (a key: its latest now). Checked
    again here, since a fire that starts an execution the flow refuses must not happen;
    ScheduleRefused or FlowNotFound when it does not start.
    """
    if row.flow_key is not None:
        flow_row = latest_version(connection, org=row.org_id, key=row.flow_key)
        if flow_row is None:
            raise FlowNotFound()
    else:
        flow_row, _ = resolve_flow(connection, org=row.org_id, named=str(row.flow_id))
    start = start_of(
        flow_row,
        key=row.id,
        transition=row.transition_id,
        fire_time=timing.local(fire_time).isoformat(),
        data=row.data,
    )
    definition = FlowDefinition.from_json(flow_row.definition)
    # The execution's trace starts here: the worker's claim continues it.
    with tracing.span(
        "schedule.fire", {"orquestador.schedule_id": row.id, "orquestador.fire_time": fire_time}
    ):
        created = insert_request(
            connection,
            org=row.org_id,
            owner=owner,
            flow_row=flow_row,
            data=start.data,
            machine_id=start.machine_id,
        )
        execution_id = queue_execution(
            connection,
            request_row=created,
            definition=definition,
            transition_id=start.transition.id,
            actor=actor,
            actor_snapshot=_actor_snapshot(row, actor),
            max_attempts=max_attempts,
            started_by=started_by,
        )
    _record(connection, row, fire_time, created.id, execution_id)
    log.info(
        "schedule fired",
        extra={
            "schedule_id": row.id,
            "request_id": str(created.id),
            "execution_id": str(execution_id),
        },
    )
    return Fired(fire_time, created.id, execution_id)


def _problems_of(refused: ScheduleRefused | FlowNotFound) -> list[Problem]:
    if isinstance(refused, FlowNotFound):
        return [Problem("/flow", "the schedule's flow no longer exists")]
    return refused.problems


def _actor_snapshot(row: Row, actor: str) -> dict[str, Any]:
    # Whoever put the schedule (or asked for this fire) acts in what it starts; a fire acts
    # with no scopes of theirs.
    return {"sub": actor, "org": row.org_id, "scopes": []}


def _record(
    connection: Connection,
    row: Row,
    fire_time: datetime,
    request_id: uuid.UUID,
    execution_id: uuid.UUID,
) -> None:
    connection.execute(
        schedule_fire.update()
        .where(
            schedule_fire.c.org_id == row.org_id,
            schedule_fire.c.schedule_id == row.id,
            schedule_fire.c.fire_time == fire_time,
        )
        .values(request_id=request_id, execution_id=execution_id)
    )


def _reject(connection: Connection, row: Row, fire_time: datetime, problems: list[Problem]) -> None:
    """Keep the fire row with no execution, and why in an audit row."""
    connection.execute(
        audit_event.insert().values(
            org_id=row.org_id,
            kind=FIRE_REJECTED_KIND,
            actor=None,
            detail={
                "scheduleId": row.id,
                "fireTime": fire_time.isoformat(),
                "problems": [p.as_dict() for p in problems],
            },
        )
    )
    log.error(
        "schedule fire refused by its flow",
        extra={"org_id": row.org_id, "schedule_id": row.id},
    )


class ScheduleFirer(Loop):
    """Starts each passed fire time of every running schedule under its catch-up policy."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_attempts: int,
        open_limit: OpenLimit,
        interval_seconds: float = POLL_SECONDS,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        super().__init__("schedules", interval_seconds)
        self.engine = engine
        self.max_attempts = max_attempts
        self.open_limit = open_limit
        self.recent = RecentRoom()
        self.batch_size = batch_size

    def run_once(self) -> bool:
        return fire_due_schedules(
            self.engine,
            max_attempts=self.max_attempts,
            batch_size=self.batch_size,
            open_limit=self.open_limit,
            recent=self.recent,
        )
