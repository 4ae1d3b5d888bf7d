"""rollout@1 on a real worker: one child per item, at most `batch` at once, within the
failure budget, and a child's end waking the parent at once."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from orquestador.db.schema import EXECUTION_READY_CHANNEL
from orquestador.worker.executor import Executor
from tests.integration.rollout_support import (
    PatchProvider,
    children,
    rollout_registry,
    running_worker,
    start_rollout,
)
from tests.integration.worker_support import (
    audit,
    checkpoints,
    execution,
    make_due,
    request_row,
    run_once,
    status_is,
    wait_until,
)

MACHINES = [f"m-{n}" for n in range(8)]


def _run_to_the_end(database: Any, engine: Engine, provider: PatchProvider, parent: Any) -> Any:
    with running_worker(database, rollout_registry(database, provider), worker_concurrency=6):
        wait_until(
            status_is(engine, parent, "SUCCEEDED", "FAILED"),
            timeout=60,
            what="the rollout's execution ended",
        )
    return execution(engine, parent)


def test_a_rollout_starts_one_child_per_item_never_more_than_the_batch_at_once(
    database: Any, runtime_engine: Engine
) -> None:
    provider = PatchProvider(seconds=0.2)
    parent = start_rollout(runtime_engine, MACHINES, batch=3, maxFailures=0)
    row = _run_to_the_end(database, runtime_engine, provider, parent)

    assert row.status == "SUCCEEDED", row.error_code
    assert sorted(machine for machine, *_ in provider.ledger) == sorted(MACHINES)
    # The provider's own timestamps: never more than the batch at once.
    assert 1 <= provider.most_at_once() <= 3
    started = children(runtime_engine, parent)
    # The database's: a child runs, for its rollout, from its execution's creation to the
    # end its rollout counted, both stamped under the rollout row's lock: the batch was
    # used, never exceeded.
    assert most_at_once([(c.created_at, c.ended_at) for c in started]) == 3
    assert [c.item_index for c in started] == list(range(len(MACHINES)))
    assert [c.machine_id for c in started] == MACHINES
    assert {(c.status, c.execution_status) for c in started} == {("succeeded", "SUCCEEDED")}
    assert {c.parent_execution_id for c in started} == {parent}
    output = checkpoints(runtime_engine, parent)["roll"].output
    assert {k: output[k] for k in ("total", "succeeded", "failed", "cancelled", "skipped")} == {
        "total": 8,
        "succeeded": 8,
        "failed": 0,
        "cancelled": 0,
        "skipped": 0,
    }
    assert output["children"][0] == {
        "item": "m-0",
        "requestId": str(started[0].id and _request_of(runtime_engine, started[0].id)),
        "executionId": str(started[0].id),
        "status": "succeeded",
    }
    assert request_row(runtime_engine, row.request_id).state == "done"
    # Each child says what started it.
    (accepted,) = audit(runtime_engine, started[5].id, "TRANSITION_ACCEPTED")
    assert accepted.detail["startedBy"] == {"rollout": str(parent), "item": 5}


def most_at_once(intervals: list[tuple[Any, Any]]) -> int:
    edges = sorted([(began, 1) for began, _ in intervals] + [(ended, -1) for _, ended in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _request_of(engine: Engine, execution_id: Any) -> Any:
    return execution(engine, execution_id).request_id


def test_once_failures_exceed_the_budget_no_child_starts_and_the_step_fails_through_its_exit(
    database: Any, runtime_engine: Engine
) -> None:
    machines = [f"m-{n}" for n in range(20)]
    provider = PatchProvider(failing=frozenset({"m-1", "m-2", "m-4", "m-5"}), seconds=0.05)
    parent = start_rollout(runtime_engine, machines, batch=2, maxFailures=1)
    row = _run_to_the_end(database, runtime_engine, provider, parent)

    assert (row.status, row.error_code) == ("FAILED", "ROLLOUT_FAILURE_BUDGET")
    assert request_row(runtime_engine, row.request_id).state == "attention"
    started = children(runtime_engine, parent)
    failures = sorted((c.ended_at, c) for c in started if c.status == "failed")
    # The budget (1) was spent by the second failure: no child was created after it ended,
    # so failures end at most `batch - 1` above that one.
    spent_at = failures[1][0]
    assert all(c.created_at < spent_at for c in started)
    assert 2 <= len(failures) <= 1 + 2
    assert len(started) < len(machines)
    (exit_row,) = audit(runtime_engine, parent, "STEP_ERROR_EXIT")
    seen = exit_row.detail["observed"]["roll"]
    assert seen["failed"] == len(failures)
    assert seen["skipped"] == len(machines) - len(started)
    assert seen["maxFailures"] == 1


def test_a_percentage_budget_is_of_all_items_and_a_parked_child_counts_as_failed(
    database: Any, runtime_engine: Engine
) -> None:
    machines = [f"m-{n}" for n in range(10)]
    provider = PatchProvider(uncertain=frozenset({"m-0"}), seconds=0.01)
    # 10 % of 10 items allows one failure: the rollout goes on past m-0, whose child
    # parked for a person (its write in doubt) and counts as failed.
    parent = start_rollout(runtime_engine, machines, batch="20%", maxFailures="10%")
    row = _run_to_the_end(database, runtime_engine, provider, parent)
    assert row.status == "SUCCEEDED", row.error_code
    output = checkpoints(runtime_engine, parent)["roll"].output
    assert (output["succeeded"], output["failed"], output["skipped"]) == (9, 1, 0)
    assert provider.most_at_once() <= 2
    parked = children(runtime_engine, parent)[0]
    assert (parked.status, parked.execution_status) == ("failed", "RECONCILIATION_REQUIRED")


def test_an_item_the_child_flow_refuses_counts_as_a_failure_and_starts_nothing(
    database: Any, runtime_engine: Engine
) -> None:
    provider = PatchProvider(seconds=0.01)
    items = ["m-0", {"machineId": "m-1"}, "m-2"]
    parent = start_rollout(
        runtime_engine, items, data={"machineId": "{/item/machineId}"}, maxFailures=5
    )
    row = _run_to_the_end(database, runtime_engine, provider, parent)
    assert row.status == "SUCCEEDED", row.error_code
    started = children(runtime_engine, parent)
    assert [(c.status, c.id is None) for c in started] == [
        ("failed", True),
        ("succeeded", False),
        ("failed", True),
    ]
    assert "nothing at /item/machineId" in started[0].refusal
    assert [m for m, *_ in provider.ledger] == ["m-1"]


def test_a_child_s_end_wakes_the_waiting_parent_at_once(
    database: Any, runtime_engine: Engine
) -> None:
    provider = PatchProvider(seconds=0.0)
    registry = rollout_registry(database, provider)
    executor = Executor(registry, _settings(database), _hooks())
    parent = start_rollout(runtime_engine, ["m-0", "m-1", "m-2"], batch=1)
    assert run_once(runtime_engine, executor) == "WAITING"
    parked = execution(runtime_engine, parent)
    assert parked.wait_key.startswith("rollout:")
    with runtime_engine.connect() as conn:
        later = conn.execute(
            text(
                "SELECT next_attempt_at > clock_timestamp() + interval '10 s' FROM execution"
                " WHERE id = :id"
            ),
            {"id": parent},
        ).scalar_one()
    assert later  # nothing but a child's end would make it due before the fallback
    (child,) = children(runtime_engine, parent)
    listener = runtime_engine.raw_connection()
    try:
        listener.driver_connection.execute(f"LISTEN {EXECUTION_READY_CHANNEL}")
        listener.driver_connection.commit()
        assert run_once(runtime_engine, executor) == "SUCCEEDED"  # the child
        notified = list(listener.driver_connection.notifies(timeout=5, stop_after=1))
    finally:
        listener.close()
    assert notified
    with runtime_engine.connect() as conn:
        due = conn.execute(
            text("SELECT next_attempt_at <= clock_timestamp() FROM execution WHERE id = :id"),
            {"id": parent},
        ).scalar_one()
    assert due
    # The parent's next round sees the end and starts the next child.
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, parent)) == 2
    assert child.status == "running"


def _settings(database: Any) -> Any:
    from tests.integration.worker_support import settings

    return settings(database_url=database.runtime_dsn)


def _hooks() -> Any:
    from orquestador.worker.hooks import WorkerHooks

    return WorkerHooks()


def test_an_item_never_gets_a_second_child_even_if_the_rollout_s_place_goes_back(
    database: Any, runtime_engine: Engine
) -> None:
    provider = PatchProvider(seconds=0.0)
    executor = Executor(rollout_registry(database, provider), _settings(database), _hooks())
    parent = start_rollout(runtime_engine, ["m-0", "m-1", "m-2"], batch=2)
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(children(runtime_engine, parent)) == 2
    # A defect (or a hand) moves the rollout back to its first item with room to start.
    with runtime_engine.begin() as conn:
        conn.execute(
            text("UPDATE rollout SET next_index = 0, running = 0 WHERE execution_id = :p"),
            {"p": parent},
        )
    make_due(runtime_engine, parent)
    run_once(runtime_engine, executor)
    # The database refused the item's second child: no child, no request written.
    with runtime_engine.connect() as conn:
        started = conn.execute(
            text("SELECT count(*) FROM execution WHERE parent_execution_id = :p"), {"p": parent}
        ).scalar_one()
        requests = conn.execute(text("SELECT count(*) FROM request")).scalar_one()
    assert started == 2
    assert requests == 3  # the parent's and its two children's


def test_a_child_ending_between_a_first_round_s_read_and_its_park_makes_it_due_at_once(
    database: Any, runtime_engine: Engine, monkeypatch: Any
) -> None:
    from orquestador.actions.builtin import rollout as rollout_adapter
    from tests.integration.worker_support import claim_one

    provider = PatchProvider(seconds=0.0)
    executor = Executor(rollout_registry(database, provider), _settings(database), _hooks())
    parent = start_rollout(runtime_engine, ["m-0", "m-1"], batch=1)
    read = rollout_adapter.read_counts

    def read_then_a_child_ends(conn: Any, rollout_id: Any) -> Any:
        seen = read(conn, rollout_id)
        # The round has read "one running"; the child ends before the round parks, while
        # the parent's row has no wait key yet for the child's end to mark.
        child_claim = claim_one(runtime_engine, "w2")
        with runtime_engine.connect() as other:
            assert executor.run(other, child_claim) == "SUCCEEDED"
        return seen

    monkeypatch.setattr(rollout_adapter, "read_counts", read_then_a_child_ends)
    assert run_once(runtime_engine, executor) == "WAITING"
    with runtime_engine.connect() as conn:
        due = conn.execute(
            text("SELECT next_attempt_at <= clock_timestamp() FROM execution WHERE id = :id"),
            {"id": parent},
        ).scalar_one()
    assert due  # not the 30 s fallback: the park saw the rollout change after its claim
