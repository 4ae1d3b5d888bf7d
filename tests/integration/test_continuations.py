"""States that continue by themselves: a finish into a state the flow names in "continue"
accepts the named transition in its own transaction, exactly once, as the person who
started the run; past MAX_CONTINUATIONS in a row the next one parks for a person."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from orquestador.actions import Effect, PermanentError
from orquestador.queue.reconciliation import Resolution, resolve
from orquestador.worker.executor import LEFT_RUNNING, Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import (
    OWNER,
    RecordingAdapter,
    action,
    audit,
    claim_one,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)


def approve_then_reboot(**reboot: Any) -> dict[str, Any]:
    """new --check--> ready, which continues with reboot: ready --reboot--> done."""
    definition = flow_definition(
        [action("check", "test.check")],
        to="ready",
        states=("new", "ready", "done", "attention"),
        transition_id="go",
    )
    definition["transitions"].append(
        {
            "id": "reboot",
            "from": ["ready"],
            "actions": [action("send", "test.send")],
            "to": "done",
            **reboot,
        }
    )
    definition["continue"] = {"ready": "reboot"}
    return definition


def doubles() -> tuple[RecordingAdapter, RecordingAdapter]:
    return (
        RecordingAdapter("test.check", Effect.READ_ONLY),
        RecordingAdapter("test.send", Effect.IDEMPOTENT_WRITE),
    )


def continued_from(engine: Engine, execution_id: uuid.UUID) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT * FROM execution WHERE continued_from = :id"), {"id": execution_id}
        ).all()


def test_a_finish_into_a_continuing_state_accepts_its_transition_as_the_same_person(
    runtime_engine: Engine,
) -> None:
    check, send = doubles()
    executor = Executor(registry_of(check, send), settings())
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})

    assert run_once(runtime_engine, executor) == "SUCCEEDED"

    (second,) = continued_from(runtime_engine, first)
    assert (second.status, second.transition_id, second.accepted_state) == (
        "PENDING",
        "reboot",
        "ready",
    )
    assert (second.continuations, second.actor_snapshot) == (1, {"sub": OWNER})
    request = request_row(runtime_engine, second.request_id)
    # Finished at revision 3, continued at 4: the request is held by the continuation.
    assert (request.state, request.revision, request.busy_execution_id) == ("ready", 4, second.id)
    assert second.accepted_revision == 4
    (said,) = audit(runtime_engine, first, "TRANSITION_CONTINUED")
    assert said.detail == {
        "state": "ready",
        "transitionId": "reboot",
        "executionId": str(second.id),
        "continuations": 1,
        "parked": False,
    }
    (accepted,) = audit(runtime_engine, second.id, "TRANSITION_ACCEPTED")
    assert accepted.actor == OWNER
    assert accepted.detail["startedBy"] == {"continuedFrom": str(first), "state": "ready"}

    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    done = request_row(runtime_engine, second.request_id)
    assert (done.state, done.revision, done.busy_execution_id) == ("done", 5, None)
    assert len(send.calls) == 1


def test_a_crash_before_the_finish_commits_keeps_neither_and_the_next_holder_continues_once(
    runtime_engine: Engine,
) -> None:
    check, send = doubles()
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})
    crashing = Executor(
        registry_of(check, send), settings(), WorkerHooks(before_finish_commit=crash_at_hook)
    )

    assert run_once(runtime_engine, crashing) == LEFT_RUNNING

    assert execution(runtime_engine, first).status == "RUNNING"
    assert continued_from(runtime_engine, first) == []
    assert request_row(runtime_engine, execution(runtime_engine, first).request_id).state == "new"
    expire_lease(runtime_engine, first)
    assert run_once(runtime_engine, Executor(registry_of(check, send), settings())) == "SUCCEEDED"
    assert len(continued_from(runtime_engine, first)) == 1
    assert len(audit(runtime_engine, first, "TRANSITION_CONTINUED")) == 1


def test_a_stale_holder_neither_finishes_nor_continues(runtime_engine: Engine) -> None:
    check, send = doubles()
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})
    stale = claim_one(runtime_engine, "w1")
    expire_lease(runtime_engine, first)
    current = claim_one(runtime_engine, "w2")
    executor = Executor(registry_of(check, send), settings())

    with runtime_engine.connect() as connection:
        assert executor.run(connection, stale) == "LEASE_LOST"
    assert continued_from(runtime_engine, first) == []
    with runtime_engine.connect() as connection:
        assert executor.run(connection, current) == "SUCCEEDED"
    assert len(continued_from(runtime_engine, first)) == 1


def test_past_the_limit_the_continuation_parks_until_a_person_lets_it_run(
    runtime_engine: Engine,
) -> None:
    # new --go--> a; a continues with ab (to b), b with ba (to a): a loop nothing stops.
    definition = flow_definition([], to="a", states=("new", "a", "b"), transition_id="go")
    definition["transitions"] += [
        {"id": "ab", "from": ["a"], "actions": [], "to": "b"},
        {"id": "ba", "from": ["b"], "actions": [], "to": "a"},
    ]
    definition["continue"] = {"a": "ab", "b": "ba"}
    executor = Executor(registry_of(), settings(max_continuations=2))
    first = start_execution(runtime_engine, definition)

    assert [run_once(runtime_engine, executor) for _ in range(3)] == ["SUCCEEDED"] * 3

    with runtime_engine.connect() as connection:
        chain = connection.execute(
            text(
                "SELECT id, request_id, status, error_code, continuations, transition_id"
                " FROM execution"
                " WHERE request_id = :rid ORDER BY created_at"
            ),
            {"rid": execution(runtime_engine, first).request_id},
        ).all()
    assert [(r.status, r.continuations) for r in chain] == [
        ("SUCCEEDED", 0),
        ("SUCCEEDED", 1),
        ("SUCCEEDED", 2),
        ("RECONCILIATION_REQUIRED", 3),
    ]
    parked = chain[-1]
    assert parked.error_code == "CONTINUATION_LIMIT"
    (why,) = audit(runtime_engine, parked.id, "RECONCILIATION_REQUIRED")
    assert (why.detail["reason"], why.detail["limit"]) == ("CONTINUATION_LIMIT", 2)
    assert request_row(runtime_engine, chain[0].request_id).busy_execution_id == parked.id

    with runtime_engine.connect() as connection:
        status = resolve(
            connection,
            Resolution(parked.id, "org-test", "operator-1", "retry", "the loop is wanted"),
            output_problems=lambda *_: [],
            claims_budget=10,
        )
    assert status == "PENDING"
    assert execution(runtime_engine, parked.id).continuations == 0
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    (onward,) = continued_from(runtime_engine, parked.id)
    assert (onward.status, onward.continuations) == ("PENDING", 1)


def test_a_continuation_whose_key_the_data_lacks_is_refused_and_the_request_rests(
    runtime_engine: Engine,
) -> None:
    check, send = doubles()
    definition = approve_then_reboot(concurrency={"key": "/data/machineId"})
    first = start_execution(runtime_engine, definition, {})

    assert run_once(runtime_engine, Executor(registry_of(check, send), settings())) == "SUCCEEDED"

    assert continued_from(runtime_engine, first) == []
    (refused,) = audit(runtime_engine, first, "CONTINUATION_REFUSED")
    assert (refused.detail["code"], refused.detail["transitionId"]) == (
        "CONCURRENCY_KEY_MISSING",
        "reboot",
    )
    request = request_row(runtime_engine, execution(runtime_engine, first).request_id)
    assert (request.state, request.busy_execution_id) == ("ready", None)


def test_the_continuation_keeps_the_runs_priority_and_holds_its_own_key(
    runtime_engine: Engine, owner_engine: Engine
) -> None:
    check, send = doubles()
    definition = approve_then_reboot(concurrency={"key": "/data/machineId"})
    first = start_execution(runtime_engine, definition, {"machineId": "m-7"})
    with owner_engine.begin() as connection:
        connection.execute(text("UPDATE execution SET priority = 8 WHERE id = :id"), {"id": first})

    assert run_once(runtime_engine, Executor(registry_of(check, send), settings())) == "SUCCEEDED"

    (second,) = continued_from(runtime_engine, first)
    assert (second.priority, second.concurrency_key, second.concurrency_limit) == (8, "m-7", 1)


def test_an_error_exit_into_a_continuing_state_does_not_continue(runtime_engine: Engine) -> None:
    refusing = RecordingAdapter(
        "test.check",
        Effect.READ_ONLY,
        output=lambda ctx: (_ for _ in ()).throw(PermanentError("NOPE", "refused")),
    )
    definition = approve_then_reboot()
    definition["transitions"][0]["actions"][0]["onError"] = "ready"
    first = start_execution(runtime_engine, definition, {"machineId": "m-1"})

    assert run_once(runtime_engine, Executor(registry_of(refusing), settings())) == "FAILED"

    assert continued_from(runtime_engine, first) == []
    request = request_row(runtime_engine, execution(runtime_engine, first).request_id)
    assert (request.state, request.busy_execution_id) == ("ready", None)


def test_a_continuation_to_a_transition_that_does_not_leave_its_state_is_refused(
    runtime_engine: Engine,
) -> None:
    # Published before publishing refused it (the helper writes the row as it is).
    check, send = doubles()
    definition = approve_then_reboot()
    definition["transitions"][1]["from"] = ["new"]
    first = start_execution(runtime_engine, definition, {"machineId": "m-1"})

    assert run_once(runtime_engine, Executor(registry_of(check, send), settings())) == "SUCCEEDED"

    assert continued_from(runtime_engine, first) == []
    (refused,) = audit(runtime_engine, first, "CONTINUATION_REFUSED")
    assert refused.detail["code"] == "TRANSITION_NOT_ALLOWED"
    request = request_row(runtime_engine, execution(runtime_engine, first).request_id)
    assert (request.state, request.busy_execution_id) == ("ready", None)


def test_no_finish_is_continued_twice_whoever_writes(
    runtime_engine: Engine, owner_engine: Engine
) -> None:
    check, send = doubles()
    first = start_execution(runtime_engine, approve_then_reboot(), {"machineId": "m-1"})
    assert run_once(runtime_engine, Executor(registry_of(check, send), settings())) == "SUCCEEDED"
    (second,) = continued_from(runtime_engine, first)

    with pytest.raises(IntegrityError), owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO execution (request_id, org_id, flow_id, transition_id,"
                " accepted_revision, accepted_state, actor_snapshot, continued_from,"
                " continuations) SELECT request_id, org_id, flow_id, transition_id, 9,"
                " accepted_state, actor_snapshot, continued_from, 1 FROM execution"
                " WHERE id = :id"
            ),
            {"id": second.id},
        )
