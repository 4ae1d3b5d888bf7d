"""One execution at a time through the executor: checkpoints, recovery, finish, retries, errors."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, text

from orquestador.actions import Effect, PermanentError, TransientError, UncertainError
from orquestador.worker.executor import LEASE_LOST, LEFT_RUNNING, Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    SimulatedCrash,
    action,
    audit,
    checkpoints,
    claim_one,
    execution,
    expire_lease,
    flow_definition,
    make_due,
    registry_of,
    request_row,
    run_once,
    settings,
    start_execution,
)


def _decision_flow(**kwargs):
    return flow_definition(
        [
            action("first", "test.read", input={"n": {"from": "/data/n"}}),
            action("second", "test.write", input={"value": {"from": "/actions/first/value"}}),
        ],
        decision={
            "hitPolicy": "FIRST",
            "inputs": ["/actions/second/echo"],
            "rules": [
                {"id": "big", "when": ["> 10"], "then": {"to": "done", "outcome": "BIG"}},
                {"id": "small", "when": ["-"], "then": {"to": "other", "outcome": "SMALL"}},
            ],
        },
        updates=[{"path": "/result", "from": "/actions/second/echo"}],
        **kwargs,
    )


def _doubles():
    first = Double(
        "test.read", Effect.READ_ONLY, output=lambda ctx: {"value": ctx.inputs["n"] * 10}
    )
    second = Double(
        "test.write", Effect.IDEMPOTENT_WRITE, output=lambda ctx: {"echo": ctx.inputs["value"]}
    )
    return first, second


def test_happy_path_writes_checkpoints_request_result_and_audit(runtime_engine):
    first, second = _doubles()
    executor = Executor(registry_of(first, second), settings())
    eid = start_execution(runtime_engine, _decision_flow(), {"n": 2})
    assert run_once(runtime_engine, executor) == "SUCCEEDED"

    row = execution(runtime_engine, eid)
    assert row.status == "SUCCEEDED" and row.lease_owner is None and row.finished_at
    assert row.result == {
        "outcome": "BIG",
        "toState": "done",
        "ruleIds": ["big"],
        "hitPolicy": "FIRST",
    }
    req = request_row(runtime_engine, row.request_id)
    assert (req.state, req.revision, req.busy_execution_id) == ("done", 3, None)
    assert req.data == {"n": 2, "result": 20}
    cps = checkpoints(runtime_engine, eid)
    assert {k: (v.status, v.effect, v.external_key, v.attempt) for k, v in cps.items()} == {
        "first": ("SUCCEEDED", "READ_ONLY", f"{eid}:first", 1),
        "second": ("SUCCEEDED", "IDEMPOTENT_WRITE", f"{eid}:second", 1),
    }
    assert len(cps["second"].input_hash) == 64 and cps["second"].output == {"echo": 20}
    (completed,) = audit(runtime_engine, eid, "TRANSITION_COMPLETED")
    assert completed.detail["transitionId"] == "go"
    assert completed.detail["actionIds"] == ["first", "second"]
    assert completed.detail["hitPolicy"] == "FIRST" and completed.detail["ruleIds"] == ["big"]
    assert second.calls[0].identity.execution_id == str(eid)


def test_recovery_reuses_succeeded_outputs_and_keeps_the_external_key(runtime_engine):
    first, second = _doubles()

    def crash_before_second(claim, action_id):
        if action_id == "second":
            raise SimulatedCrash

    crashing = Executor(
        registry_of(first, second), settings(), WorkerHooks(before_adapter=crash_before_second)
    )
    eid = start_execution(runtime_engine, _decision_flow(), {"n": 2})
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing, "crashed")
    cps = checkpoints(runtime_engine, eid)
    assert (cps["first"].status, cps["second"].status) == ("SUCCEEDED", "RUNNING")

    expire_lease(runtime_engine, eid)
    recovering = Executor(registry_of(first, second), settings())
    assert run_once(runtime_engine, recovering, "recovered") == "SUCCEEDED"
    assert len(first.calls) == 1, "a SUCCEEDED action ran again"
    assert [c.external_key for c in second.calls] == [f"{eid}:second"]
    assert [c.inputs for c in second.calls] == [{"value": 20}], "not from the recovered output"
    cps = checkpoints(runtime_engine, eid)
    assert (cps["second"].status, cps["second"].attempt) == ("SUCCEEDED", 2)
    assert (
        request_row(runtime_engine, execution(runtime_engine, eid).request_id).data["result"] == 20
    )


def test_external_key_is_stable_across_retried_attempts(runtime_engine):
    outcomes = iter([UncertainError(), TransientError(), None])

    def flaky(ctx):
        failure = next(outcomes)
        if failure:
            raise failure
        return {"echo": 1}

    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=3, output=flaky)
    executor = Executor(
        registry_of(write), settings(retry_base_seconds=0.001, retry_cap_seconds=0.001)
    )
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    assert checkpoints(runtime_engine, eid)["w"].status == "UNKNOWN"
    for expected in ("RETRY_WAIT", "SUCCEEDED"):
        make_due(runtime_engine, eid)
        assert run_once(runtime_engine, executor) == expected
    assert [c.external_key for c in write.calls] == [f"{eid}:w"] * 3
    assert [c.attempt for c in write.calls] == [1, 2, 3]


def test_interrupted_non_idempotent_write_requires_reconciliation(runtime_engine):
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE)
    crashing = Executor(
        registry_of(charge),
        settings(),
        WorkerHooks(after_adapter=lambda c, a: (_ for _ in ()).throw(SimulatedCrash())),
    )
    eid = start_execution(runtime_engine, flow_definition([action("charge", "test.charge")]))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    expire_lease(runtime_engine, eid)
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    assert len(charge.calls) == 1, "a non-idempotent write was repeated"
    row = execution(runtime_engine, eid)
    assert row.error_code == "INTERRUPTED_NON_IDEMPOTENT_WRITE" and row.lease_owner is None
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid
    assert checkpoints(runtime_engine, eid)["charge"].status == "UNKNOWN"
    (parked,) = audit(runtime_engine, eid, "RECONCILIATION_REQUIRED")
    assert parked.detail["checkpoints"][0]["externalKey"] == f"{eid}:charge"


def test_uncertain_non_idempotent_write_is_parked_not_retried(runtime_engine):
    charge = Double(
        "test.charge",
        Effect.NON_IDEMPOTENT_WRITE,
        max_attempts=5,
        output=lambda ctx: (_ for _ in ()).throw(TimeoutError()),
    )
    eid = start_execution(runtime_engine, flow_definition([action("charge", "test.charge")]))
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    assert checkpoints(runtime_engine, eid)["charge"].status == "UNKNOWN"
    assert execution(runtime_engine, eid).error_code == "UNCERTAIN_OUTCOME"


def test_updates_violating_the_data_schema_roll_back_and_keep_checkpoints(runtime_engine):
    read = Double("test.read", Effect.READ_ONLY, output={"value": "text"})
    definition = flow_definition(
        [action("r", "test.read")],
        updates=[{"path": "/n", "from": "/actions/r/value"}],
        data_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    eid = start_execution(runtime_engine, definition, {"n": 1})
    assert run_once(runtime_engine, Executor(registry_of(read), settings())) == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "DATA_INVALID"
    req = request_row(runtime_engine, row.request_id)
    assert (req.state, req.data, req.busy_execution_id) == ("new", {"n": 1}, None)
    assert checkpoints(runtime_engine, eid)["r"].status == "SUCCEEDED"
    assert not audit(runtime_engine, eid, "TRANSITION_COMPLETED")


def test_a_failed_finish_after_a_write_is_parked_for_reconciliation(runtime_engine):
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output={"value": "text"})
    definition = flow_definition(
        [action("w", "test.write")],
        updates=[{"path": "/n", "from": "/actions/w/value"}],
        data_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    eid = start_execution(runtime_engine, definition, {"n": 1})
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    row = execution(runtime_engine, eid)
    assert request_row(runtime_engine, row.request_id).busy_execution_id == eid


def test_failure_inside_the_finish_transaction_rolls_back_and_recovery_finishes(runtime_engine):
    first, second = _doubles()

    def explode(claim):
        raise RuntimeError("injected before commit")

    failing = Executor(
        registry_of(first, second), settings(), WorkerHooks(before_finish_commit=explode)
    )
    eid = start_execution(runtime_engine, _decision_flow(), {"n": 2})
    assert run_once(runtime_engine, failing) == LEFT_RUNNING
    row = execution(runtime_engine, eid)
    assert row.status == "RUNNING" and row.result is None
    req = request_row(runtime_engine, row.request_id)
    assert (req.state, req.revision, req.data, req.busy_execution_id) == ("new", 2, {"n": 2}, eid)
    assert {v.status for v in checkpoints(runtime_engine, eid).values()} == {"SUCCEEDED"}
    assert not audit(runtime_engine, eid, "TRANSITION_COMPLETED")

    expire_lease(runtime_engine, eid)
    assert run_once(runtime_engine, Executor(registry_of(first, second), settings())) == "SUCCEEDED"
    assert (len(first.calls), len(second.calls)) == (1, 1)


def test_a_request_modified_since_acceptance_is_rejected_before_any_adapter(runtime_engine):
    write = Double("test.write")
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    with runtime_engine.begin() as conn:
        conn.execute(text("UPDATE request SET revision = revision + 1, state = 'other'"))
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "FAILED"
    assert write.calls == []
    row = execution(runtime_engine, eid)
    assert row.error_code == "REQUEST_CHANGED"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None


def test_transient_failure_schedules_a_bounded_retry_with_audit(runtime_engine):
    read = Double(
        "test.read",
        Effect.READ_ONLY,
        max_attempts=3,
        output=lambda ctx: (_ for _ in ()).throw(TransientError()),
    )
    executor = Executor(registry_of(read), settings(retry_base_seconds=4, retry_cap_seconds=60))
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    claim = claim_one(runtime_engine)
    with runtime_engine.connect() as conn:
        assert executor.run(conn, claim) == "RETRY_WAIT"
        now = conn.execute(text("SELECT clock_timestamp()")).scalar()
    row = execution(runtime_engine, eid)
    assert row.lease_owner is None and row.lease_expires_at is None
    assert claim.claimed_at <= row.next_attempt_at <= now + timedelta(seconds=4)
    (scheduled,) = audit(runtime_engine, eid, "RETRY_SCHEDULED")
    assert scheduled.detail["actionId"] == "r" and scheduled.detail["errorCode"] == "TRANSIENT"
    assert 0 <= scheduled.detail["delaySeconds"] <= 4
    cp = checkpoints(runtime_engine, eid)["r"]
    assert (cp.status, cp.error_code) == ("FAILED", "TRANSIENT")


def test_retry_after_is_honoured_within_bounds(runtime_engine):
    read = Double(
        "test.read",
        Effect.READ_ONLY,
        output=lambda ctx: (_ for _ in ()).throw(TransientError(retry_after=10_000)),
    )
    executor = Executor(registry_of(read), settings(retry_after_max_seconds=120))
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    (scheduled,) = audit(runtime_engine, eid, "RETRY_SCHEDULED")
    assert scheduled.detail["delaySeconds"] == 120


@pytest.mark.parametrize(
    ("earlier_effect", "expected"),
    [
        (Effect.READ_ONLY, "FAILED"),
        (Effect.IDEMPOTENT_WRITE, "RECONCILIATION_REQUIRED"),
    ],
)
def test_exhaustion_fails_only_when_no_write_happened(runtime_engine, earlier_effect, expected):
    earlier = Double("test.earlier", earlier_effect)
    flaky = Double(
        "test.read",
        Effect.READ_ONLY,
        max_attempts=2,
        output=lambda ctx: (_ for _ in ()).throw(TransientError()),
    )
    executor = Executor(
        registry_of(earlier, flaky), settings(retry_base_seconds=0.001, retry_cap_seconds=0.001)
    )
    eid = start_execution(
        runtime_engine, flow_definition([action("e", "test.earlier"), action("r", "test.read")])
    )
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == expected
    assert len(flaky.calls) == 2 and len(earlier.calls) == 1
    row = execution(runtime_engine, eid)
    busy = request_row(runtime_engine, row.request_id).busy_execution_id
    assert busy == (None if expected == "FAILED" else eid)
    assert row.error_code == "RETRIES_EXHAUSTED"


def test_permanent_error_takes_the_steps_error_exit(runtime_engine):
    earlier = Double("test.write", Effect.IDEMPOTENT_WRITE)

    def deadline_passed(ctx):
        raise PermanentError("DEADLINE", "command still running", observed={"command": "sent"})

    wait = Double("test.wait", Effect.READ_ONLY, output=deadline_passed)
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [action("send", "test.write"), action("wait", "test.wait", onError="attention")]
        ),
    )
    assert run_once(runtime_engine, Executor(registry_of(earlier, wait), settings())) == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "DEADLINE"
    assert row.result["toState"] == "attention"
    req = request_row(runtime_engine, row.request_id)
    assert (req.state, req.busy_execution_id, req.revision) == ("attention", None, 3)
    (exit_row,) = audit(runtime_engine, eid, "STEP_ERROR_EXIT")
    assert exit_row.detail["observed"] == {"wait": {"command": "sent"}}
    assert exit_row.detail["actionId"] == "wait" and exit_row.detail["toState"] == "attention"
    assert checkpoints(runtime_engine, eid)["wait"].status == "FAILED"


def test_permanent_error_without_error_exit_fails_and_releases(runtime_engine):
    read = Double(
        "test.read",
        Effect.READ_ONLY,
        output=lambda ctx: (_ for _ in ()).throw(PermanentError("NOT_FOUND")),
    )
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    assert run_once(runtime_engine, Executor(registry_of(read), settings())) == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "NOT_FOUND"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None


def test_noop_refuses_outside_simulation_and_runs_in_one(runtime_engine):
    executor = Executor(registry_of(), settings())
    real = start_execution(runtime_engine, flow_definition([action("n", "noop")]))
    assert run_once(runtime_engine, executor) == "FAILED"
    assert execution(runtime_engine, real).error_code == "SIMULATION_ONLY"
    assert checkpoints(runtime_engine, real) == {}
    dry = start_execution(runtime_engine, flow_definition([action("n", "noop")]), simulation=True)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert execution(runtime_engine, dry).status == "SUCCEEDED"


def test_unknown_capability_is_integration_unavailable(runtime_engine):
    eid = start_execution(runtime_engine, flow_definition([action("x", "acme.missing")]))
    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "FAILED"
    assert execution(runtime_engine, eid).error_code == "INTEGRATION_UNAVAILABLE"


def test_a_recovered_checkpoint_that_does_not_match_blocks_with_contract_mismatch(runtime_engine):
    first, second = _doubles()

    def crash(claim, action_id):
        if action_id == "second":
            raise SimulatedCrash

    eid = start_execution(runtime_engine, _decision_flow(), {"n": 2})
    with pytest.raises(SimulatedCrash):
        run_once(
            runtime_engine,
            Executor(registry_of(first, second), settings(), WorkerHooks(before_adapter=crash)),
        )
    with runtime_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE action_execution SET input_hash = repeat('0', 64) WHERE action_id = 'first'"
            )
        )
    expire_lease(runtime_engine, eid)
    assert run_once(runtime_engine, Executor(registry_of(first, second), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    assert len(first.calls) == 1
    assert execution(runtime_engine, eid).error_code == "CONTRACT_MISMATCH"


def test_a_stale_worker_returning_late_cannot_overwrite_the_new_result(runtime_engine):
    release = threading.Event()
    started = threading.Event()
    calls = []

    def slow_then_fast(ctx):
        calls.append(ctx.attempt)
        if len(calls) == 1:
            started.set()
            assert release.wait(20)
            return {"echo": "stale"}
        return {"echo": "fresh"}

    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output=slow_then_fast)
    definition = flow_definition(
        [action("w", "test.write")], updates=[{"path": "/by", "from": "/actions/w/echo"}]
    )
    eid = start_execution(runtime_engine, definition)
    stale_claim = claim_one(runtime_engine, "stale")
    outcome = {}

    def stale_worker():
        with runtime_engine.connect() as conn:
            outcome["stale"] = Executor(registry_of(write), settings()).run(conn, stale_claim)

    thread = threading.Thread(target=stale_worker)
    thread.start()
    assert started.wait(20)
    expire_lease(runtime_engine, eid)
    assert (
        run_once(runtime_engine, Executor(registry_of(write), settings()), "fresh") == "SUCCEEDED"
    )
    release.set()
    thread.join(20)
    assert outcome["stale"] == LEASE_LOST
    row = execution(runtime_engine, eid)
    req = request_row(runtime_engine, row.request_id)
    assert req.data == {"by": "fresh"} and req.revision == 3
    assert checkpoints(runtime_engine, eid)["w"].output == {"echo": "fresh"}
    assert len(audit(runtime_engine, eid, "TRANSITION_COMPLETED")) == 1


def _writers(engine, execution_id) -> dict[str, int]:
    # The id of the transaction that last wrote each row of the execution.
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT 'execution' AS row, xmin::text::bigint AS tx FROM execution"
                " WHERE id = :id UNION ALL SELECT action_id, xmin::text::bigint"
                " FROM action_execution WHERE execution_id = :id"
            ),
            {"id": execution_id},
        ).all()
    return {row.row: row.tx for row in rows}


def test_a_safe_steps_success_rides_in_the_next_write_and_is_durable_before_the_next_call(
    runtime_engine,
):
    first, second = _doubles()
    seen_before_second: list[str] = []

    def before_adapter(claim, action_id):
        if action_id == "second":  # read from another connection: only what committed
            seen_before_second.append(
                checkpoints(runtime_engine, claim.execution_id)["first"].status
            )

    executor = Executor(
        registry_of(first, second), settings(), WorkerHooks(before_adapter=before_adapter)
    )
    eid = start_execution(runtime_engine, _decision_flow(), {"n": 2})
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    # The first step's SUCCEEDED rode with the second's RUNNING, and was committed
    # before the second adapter was called.
    assert seen_before_second == ["SUCCEEDED"]
    # The last one rode in the finish's transaction, which moved the request.
    req = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (req.state, req.data, req.busy_execution_id) == ("done", {"n": 2, "result": 20}, None)
    written = _writers(runtime_engine, eid)
    assert written["second"] == written["execution"]
    assert {v.status for v in checkpoints(runtime_engine, eid).values()} == {"SUCCEEDED"}
    # Two writes for two steps and a finish (was five): the read writes nothing before
    # its call, its whole attempt rides in the write's RUNNING; each its own transaction.
    stats = executor.writer_stats()
    assert (stats.rows, stats.batches) == (2, 2)
    executor.close()


def test_a_non_idempotent_last_steps_success_commits_before_the_finish(runtime_engine):
    pay = Double("test.pay", Effect.NON_IDEMPOTENT_WRITE)
    eid = start_execution(runtime_engine, flow_definition([action("pay", "test.pay")]))
    assert run_once(runtime_engine, Executor(registry_of(pay), settings())) == "SUCCEEDED"
    req = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert req.busy_execution_id is None and req.revision == 3
    written = _writers(runtime_engine, eid)
    # Never left to ride: a crash inside the finish must not turn a done payment into
    # a doubt, so its SUCCEEDED is durable before the finish begins.
    assert written["pay"] != written["execution"]


def test_a_failed_decision_keeps_the_last_steps_success(runtime_engine):
    # The decision's data fails the schema after the last step, a write, succeeded: the
    # held-back SUCCEEDED checkpoint is written first, so the write is known done and
    # the request stays blocked for an operator instead of being released as FAILED.
    write = Double("test.write", output=lambda ctx: {"n": "not a number"})
    definition = flow_definition(
        [action("w", "test.write")], updates=[{"path": "/n", "from": "/actions/w/n"}]
    )
    definition["dataSchema"] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    eid = start_execution(runtime_engine, definition, {"n": 1})
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    row = execution(runtime_engine, eid)
    assert row.error_code == "DATA_INVALID"
    cp = checkpoints(runtime_engine, eid)["w"]
    assert (cp.status, cp.output) == ("SUCCEEDED", {"n": "not a number"})
    # The request is neither moved nor released: blocked, with its data as accepted.
    req = request_row(runtime_engine, row.request_id)
    assert (req.state, req.data, req.busy_execution_id) == ("new", {"n": 1}, eid)


def test_a_run_takes_a_pooled_connection_only_when_it_needs_one(runtime_engine):
    checkouts: list[object] = []
    event.listen(runtime_engine, "checkout", lambda *args: checkouts.append(args))
    first, second = _doubles()
    executor = Executor(registry_of(first, second), settings())
    start_execution(runtime_engine, _decision_flow(), {"n": 2})
    claim = claim_one(runtime_engine)
    checkouts.clear()
    # A first holder that succeeds writes through the writer only: no connection of its own.
    assert executor.run(runtime_engine, claim) == "SUCCEEDED"
    assert checkouts == []

    failing = Double("test.write", output=lambda ctx: (_ for _ in ()).throw(PermanentError("NOPE")))
    start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    claim = claim_one(runtime_engine)
    checkouts.clear()
    # Failing is written on the job's own connection, taken then and given back after.
    assert Executor(registry_of(failing), settings()).run(runtime_engine, claim) == "FAILED"
    assert len(checkouts) == 1
    assert runtime_engine.pool.checkedout() == 0


def _nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    "output",
    [{"note": "a\x00b"}, {"a\x00": 1}, {"bad": "\ud800"}, _nested(5000)],
    ids=["nul in a value", "nul in a key", "lone surrogate", "5000 levels deep"],
)
def test_an_output_postgresql_cannot_store_fails_output_invalid_on_the_first_attempt(
    runtime_engine, output
):
    # Regression: an output holding U+0000 met three database errors (the checkpoint
    # write, then each retry of it) and a park, instead of OUTPUT_INVALID at once.
    read = Double("test.read", Effect.READ_ONLY, output=lambda ctx: output)
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    status = run_once(runtime_engine, Executor(registry_of(read), settings()))
    assert status == "FAILED" and len(read.calls) == 1
    row = execution(runtime_engine, eid)
    assert (row.status, row.error_code, row.attempts) == ("FAILED", "OUTPUT_INVALID", 1)
    checkpoint = checkpoints(runtime_engine, eid)["r"]
    assert (checkpoint.status, checkpoint.error_code) == ("FAILED", "OUTPUT_INVALID")
    # A read changed nothing: the request is released in its accepted state.
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.busy_execution_id, request.data) == ("new", None, {})
