"""Real worker processes firing one schedule: one execution per fire time, a SIGKILL mid-fire too.

Several `orquestador worker` processes poll the same schedules; the firing round's row
lock (SKIP LOCKED) and the fire row's key keep each fire time to one execution. A worker
killed inside its firing transaction leaves nothing of it, and the others fire that fire
time once.
"""

from __future__ import annotations

import signal
import subprocess
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

from tests.acceptance.crash_support import spawn_worker
from tests.integration.schedule_support import executions_per_fire_time, fires, schedule_flow
from tests.integration.worker_support import ORG, publish_flow, wait_until

# The flows here have no actions: no adapter module is needed.
NO_ADAPTERS = ""


def _schedule_every_second(
    engine: Engine, flow_id: object, schedule_id: str, behind: int
) -> datetime:
    """A schedule that fires every second, catching up all, `behind` seconds late already."""
    with engine.begin() as connection:
        return connection.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, every_seconds, catch_up, updated_by,"
                " next_fire_at)"
                " VALUES (:org, :id, :flow, 1, 'all', 'tester',"
                "         date_trunc('second', clock_timestamp()) - make_interval(secs => :behind))"
                " RETURNING next_fire_at"
            ),
            {"org": ORG, "id": schedule_id, "flow": flow_id, "behind": behind},
        ).scalar_one()


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        # A worker still starting when told to stop may end by the signal itself.
        worker.wait(60)


def _assert_each_fire_time_started_once(engine: Engine, schedule_id: str, first: datetime) -> int:
    handled = fires(engine, schedule_id)
    # Every second from the first fire time on, none left out ('all' misses nothing)...
    assert [t for t, _, _ in handled] == [first + timedelta(seconds=n) for n in range(len(handled))]
    # ... each with its execution, and no fire time with a second one.
    assert all(execution_id is not None for _, _, execution_id in handled)
    per_fire_time = executions_per_fire_time(engine, schedule_id)
    assert len(per_fire_time) == len(handled)
    assert set(per_fire_time.values()) == {1}
    with engine.connect() as connection:
        missed = connection.execute(
            text("SELECT missed FROM schedule WHERE id = :id"), {"id": schedule_id}
        ).scalar_one()
    assert missed == 0
    return len(handled)


def test_three_workers_start_one_execution_per_fire_time(
    database, runtime_engine: Engine, owner_engine: Engine, processes, tmp_path
) -> None:
    flow_id = publish_flow(owner_engine, schedule_flow())
    first = _schedule_every_second(owner_engine, flow_id, "race", behind=60)
    ledger = tmp_path / "ledger.jsonl"

    workers = [spawn_worker(database, NO_ADAPTERS, ledger, f"w-{n}") for n in range(3)]
    processes.extend(workers)
    # The 61 passed fire times, then a few more as they come, fired by whichever worker.
    wait_until(
        lambda: len(fires(runtime_engine, "race")) >= 66,
        timeout=90,
        what="the catch-up and five live fire times",
    )
    _stop(workers)

    assert _assert_each_fire_time_started_once(runtime_engine, "race", first) >= 66


def _stopped_mid_fire(engine: Engine) -> bool:
    """A session that wrote a fire row waits for the audit lock: a firing transaction."""
    with engine.connect() as connection:
        return bool(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks waiting"
                    " JOIN pg_locks fired ON fired.pid = waiting.pid"
                    " WHERE waiting.relation = CAST('audit_event' AS regclass)"
                    " AND NOT waiting.granted"
                    " AND fired.relation = CAST('schedule_fire' AS regclass) AND fired.granted"
                    " AND fired.mode = 'RowExclusiveLock'"
                )
            ).scalar_one()
        )


def test_a_worker_killed_mid_fire_loses_nothing_and_doubles_nothing(
    database, runtime_engine: Engine, owner_engine: Engine, processes, tmp_path
) -> None:
    flow_id = publish_flow(owner_engine, schedule_flow())
    ledger = tmp_path / "ledger.jsonl"
    # The firing transaction writes the fire row, the request and the execution, then the
    # acceptance's audit row: holding audit_event stops the victim right there, mid-fire.
    gate = owner_engine.connect()
    gate.begin()
    gate.execute(text("LOCK TABLE audit_event IN SHARE MODE"))
    try:
        first = _schedule_every_second(owner_engine, flow_id, "crash", behind=5)
        victim = spawn_worker(database, NO_ADAPTERS, ledger, "victim")
        processes.append(victim)
        wait_until(
            lambda: _stopped_mid_fire(runtime_engine),
            timeout=60,
            what="the victim inside its firing transaction",
        )
        assert fires(runtime_engine, "crash") == []  # nothing of it is committed
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    finally:
        # The dead worker's session finishes its statement, finds its client gone and
        # rolls back; the schedule's row lock goes with it.
        gate.rollback()
        gate.close()

    survivors = [spawn_worker(database, NO_ADAPTERS, ledger, f"survivor-{n}") for n in range(2)]
    processes.extend(survivors)
    wait_until(
        lambda: len(fires(runtime_engine, "crash")) >= 10,
        timeout=90,
        what="the survivors firing the victim's fire times and more",
    )
    _stop(survivors)

    assert _assert_each_fire_time_started_once(runtime_engine, "crash", first) >= 10


OTHER = "org-quiet"


def _lateness(engine: Engine, schedule_id: str) -> tuple[list[float], int]:
    """Seconds from each fire time to its request's creation, and the fires let go."""
    with engine.connect() as connection:
        late = connection.execute(
            text(
                "SELECT extract(epoch FROM r.created_at - f.fire_time) FROM schedule_fire f"
                " JOIN request r ON r.id = f.request_id WHERE f.schedule_id = :id"
                " ORDER BY f.fire_time"
            ),
            {"id": schedule_id},
        ).scalars()
        missed = connection.execute(
            text("SELECT missed FROM schedule WHERE id = :id"), {"id": schedule_id}
        ).scalar_one()
    return [float(seconds) for seconds in late], missed


def test_one_organization_s_flood_of_schedules_never_makes_another_s_miss(
    database, runtime_engine: Engine, owner_engine: Engine, processes, tmp_path
) -> None:
    """A thousand every-second schedules of one organization, one every-2-second schedule
    of another, two real workers: the other's fires stay on time (before fair firing,
    its fires came seconds late and most were missed)."""
    flow_id = publish_flow(owner_engine, schedule_flow())
    with owner_engine.begin() as connection:
        other_flow = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) SELECT :other, key, version, trigger, definition, data_schema,"
                " created_by FROM flow WHERE id = :flow RETURNING id"
            ),
            {"other": OTHER, "flow": flow_id},
        ).scalar_one()
        start = "date_trunc('second', clock_timestamp()) + interval '3 s'"
        connection.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, every_seconds, updated_by,"
                f" next_fire_at) SELECT :org, 'flood-' || n, :flow, 1, 'flooder', {start}"
                " FROM generate_series(1, 1000) AS n"
            ),
            {"org": ORG, "flow": flow_id},
        )
        connection.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, every_seconds, updated_by,"
                f" next_fire_at) VALUES (:org, 'quiet', :flow, 2, 'tenant', {start})"
            ),
            {"org": OTHER, "flow": other_flow},
        )
    ledger = tmp_path / "ledger.jsonl"

    workers = [spawn_worker(database, NO_ADAPTERS, ledger, f"w-{n}") for n in range(2)]
    processes.extend(workers)
    wait_until(
        lambda: len(fires(runtime_engine, "quiet")) >= 8,
        timeout=60,
        what="eight fires of the quiet organization's schedule",
    )
    _stop(workers)

    late, missed = _lateness(runtime_engine, "quiet")
    print(f"quiet schedule: {len(late)} fires, {missed} missed, late max {max(late):.2f} s")
    assert missed == 0
    # One round behind at most, with room for two busy shared cores.
    assert max(late) < 3.0, late
