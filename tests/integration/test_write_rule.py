"""The write rule over the attempt history, and error exits that keep the request's data.

A failure after a write that happened, or may have happened, never releases the
request as FAILED: not when a later attempt of the same action failed in a way that
is known, and not through the step's declared error exit either.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from orquestador.actions import Effect, PermanentError, TransientError, UncertainError
from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    SimulatedCrash,
    action,
    attempt_history,
    audit,
    checkpoints,
    claim_one,
    crash_at_hook,
    execution,
    expire_lease,
    flow_definition,
    make_due,
    registry_of,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
)


def _data_text(engine, request_id) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT data::text FROM request WHERE id = :id"), {"id": request_id}
        ).scalar_one()


def _run_until_it_ends(engine, executor) -> str:
    """Run attempt after attempt, making each retry due at once; the status it ends in."""
    while True:
        status = run_once(engine, executor)
        if status != "RETRY_WAIT":
            return status
        make_due(engine, claim_due_id(engine))


def claim_due_id(engine):
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT id FROM execution WHERE status = 'RETRY_WAIT'")
        ).scalar_one()


def _assert_parked_and_busy(engine, eid, state="new"):
    row = execution(engine, eid)
    assert row.status == "RECONCILIATION_REQUIRED"
    request = request_row(engine, row.request_id)
    assert (request.state, request.busy_execution_id) == (state, eid)
    assert not audit(engine, eid, "EXECUTION_FAILED")
    assert not audit(engine, eid, "STEP_ERROR_EXIT")
    return row


def test_an_error_exit_keeps_the_request_data_byte_for_byte(runtime_engine):
    write = Double(
        "test.write", Effect.IDEMPOTENT_WRITE, output=scripted(PermanentError("REFUSED"))
    )
    data = {"b": [1.5, {"z": None, "a": "ñandú"}], "a": 10, "nested": {"k": "v"}}
    eid = start_execution(
        runtime_engine,
        flow_definition([action("w", "test.write", onError="attention")]),
        data,
    )
    request_id = execution(runtime_engine, eid).request_id
    before = _data_text(runtime_engine, request_id)

    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "FAILED"

    request = request_row(runtime_engine, request_id)
    assert (request.state, request.busy_execution_id) == ("attention", None)
    assert _data_text(runtime_engine, request_id) == before
    assert json.loads(before) == data
    # The execution's NULLs are SQL NULL, not the JSON value null.
    with runtime_engine.connect() as conn:
        detail_is_null = conn.execute(
            text(
                "SELECT result IS NOT NULL, error_detail IS NOT NULL FROM execution WHERE id = :id"
            ),
            {"id": eid},
        ).one()
    assert tuple(detail_is_null) == (True, True)


def test_a_failure_without_writes_keeps_sql_nulls(runtime_engine):
    read = Double("test.read", Effect.READ_ONLY, output=scripted(PermanentError("NOPE")))
    eid = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    assert run_once(runtime_engine, Executor(registry_of(read), settings())) == "FAILED"
    with runtime_engine.connect() as conn:
        result_is_null = conn.execute(
            text("SELECT result IS NULL FROM execution WHERE id = :id"), {"id": eid}
        ).scalar_one()
    assert result_is_null


# (steps the adapter plays, onError?, expected status, expected history of (status, code))
CASES = {
    "uncertain then transient until exhausted": (
        [UncertainError("timeout reading the answer"), TransientError("503"), TransientError()],
        None,
        "RECONCILIATION_REQUIRED",
        [("UNKNOWN", "UNCERTAIN"), ("FAILED", "TRANSIENT"), ("FAILED", "TRANSIENT")],
    ),
    "uncertain then permanent without onError": (
        [UncertainError(), PermanentError("REFUSED")],
        None,
        "RECONCILIATION_REQUIRED",
        [("UNKNOWN", "UNCERTAIN"), ("FAILED", "REFUSED")],
    ),
    "uncertain then permanent with onError": (
        [UncertainError(), PermanentError("REFUSED")],
        "attention",
        "RECONCILIATION_REQUIRED",
        [("UNKNOWN", "UNCERTAIN"), ("FAILED", "REFUSED")],
    ),
    # The contrast: a known failure before a permanent one leaves no write in doubt.
    "transient then permanent with onError": (
        [TransientError(), PermanentError("REFUSED")],
        "attention",
        "FAILED",
        [("FAILED", "TRANSIENT"), ("FAILED", "REFUSED")],
    ),
    "transient until exhausted": (
        [TransientError(), TransientError(), TransientError()],
        None,
        "FAILED",
        [("FAILED", "TRANSIENT")] * 3,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_write_rule_reads_every_attempt(runtime_engine, case):
    steps, on_error, expected, history = CASES[case]
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=3, output=scripted(*steps))
    extra = {"onError": on_error} if on_error else {}
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write", **extra)]))

    assert _run_until_it_ends(runtime_engine, Executor(registry_of(write), settings())) == expected

    rows = attempt_history(runtime_engine, eid, "w")
    assert [(r.status, r.error_code) for r in rows] == history
    assert [r.attempt for r in rows] == list(range(1, len(history) + 1))
    assert {call.external_key for call in write.calls} == {f"{eid}:w"}
    if expected == "RECONCILIATION_REQUIRED":
        row = _assert_parked_and_busy(runtime_engine, eid)
        assert row.error_detail["writesInDoubt"] == ["w"]
    else:
        request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
        assert request.busy_execution_id is None
        assert request.state == (on_error or "new")


def test_a_crash_mid_call_then_transient_failures_park_the_execution(runtime_engine):
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=2)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    crashing = Executor(registry_of(write), settings(), WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    expire_lease(runtime_engine, eid)

    write.output = scripted(TransientError("503"))
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == (
        "RECONCILIATION_REQUIRED"
    )

    rows = attempt_history(runtime_engine, eid, "w")
    assert [(r.status, r.error_code) for r in rows] == [
        ("UNKNOWN", "INTERRUPTED"),
        ("FAILED", "TRANSIENT"),
    ]
    assert rows[0].finished_at is None  # nobody saw the interrupted attempt end
    _assert_parked_and_busy(runtime_engine, eid)


def test_an_interrupted_idempotent_write_with_no_attempt_left_is_parked(runtime_engine):
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=1)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    crashing = Executor(registry_of(write), settings(), WorkerHooks(after_adapter=crash_at_hook))
    with pytest.raises(SimulatedCrash):
        run_once(runtime_engine, crashing)
    expire_lease(runtime_engine, eid)

    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    assert len(write.calls) == 1  # never called again
    row = _assert_parked_and_busy(runtime_engine, eid)
    assert row.error_code == "RETRIES_EXHAUSTED"
    assert checkpoints(runtime_engine, eid)["w"].status == "UNKNOWN"
    assert [(r.status, r.error_code) for r in attempt_history(runtime_engine, eid, "w")] == [
        ("UNKNOWN", "INTERRUPTED")
    ]


def test_an_earlier_uncertain_write_blocks_a_later_steps_error_exit(runtime_engine):
    # Action "a" ended UNKNOWN and then SUCCEEDED is a known write; action "b" with an
    # earlier UNKNOWN attempt and a final FAILED is not.
    a = Double("test.a", Effect.IDEMPOTENT_WRITE, output=scripted(UncertainError(), {"ok": 1}))
    b = Double(
        "test.b",
        Effect.IDEMPOTENT_WRITE,
        output=scripted(UncertainError(), PermanentError("REFUSED")),
    )
    definition = flow_definition(
        [action("a", "test.a"), action("b", "test.b", onError="attention")]
    )
    eid = start_execution(runtime_engine, definition)
    assert _run_until_it_ends(runtime_engine, Executor(registry_of(a, b), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    row = _assert_parked_and_busy(runtime_engine, eid)
    assert row.error_detail["writesInDoubt"] == ["b"]
    assert row.error_detail["writesSucceeded"] == ["a"]


@pytest.mark.parametrize("effect", [Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE])
def test_a_checkpoint_written_behind_the_runs_back_is_parked_not_raised(
    runtime_engine, owner_engine, effect
):
    write = Double("test.write", effect)
    eid = start_execution(runtime_engine, flow_definition([action("w", "test.write")]))
    claim = claim_one(runtime_engine)
    assert claim.snapshot is not None and claim.snapshot.checkpoints == {}
    # Someone else's checkpoint appears after the claim read there was none.
    with owner_engine.begin() as conn:
        conn.execute(
            text("""INSERT INTO action_execution (execution_id, action_id, status, attempt,
                        fencing_token, input_hash, external_key, effect, capability,
                        adapter_version)
                    VALUES (:id, 'w', 'SUCCEEDED', 1, 1, 'other', 'other-key',
                            :effect, 'test.write', 1)"""),
            {"id": eid, "effect": effect.value},
        )
    with runtime_engine.connect() as conn:
        status = Executor(registry_of(write), settings()).run(conn, claim)
    assert status == "RECONCILIATION_REQUIRED"
    # A non-idempotent write finds it with its RUNNING, before its call; a safe step
    # writes none before its call (SPEC 28) and finds it when its attempt is recorded.
    assert len(write.calls) == (0 if effect is Effect.NON_IDEMPOTENT_WRITE else 1)
    row = _assert_parked_and_busy(runtime_engine, eid)
    assert row.error_code == "CONTRACT_MISMATCH"


def test_attempt_messages_are_kept_bounded_and_without_inputs(runtime_engine):
    secret = "tok-3f9a7c1e5b"

    def fail(ctx):
        raise TransientError(f"provider said no to {ctx.inputs['token']} " + "x" * 5000)

    write = Double("test.write", Effect.IDEMPOTENT_WRITE, max_attempts=1, output=fail)
    definition = flow_definition(
        [action("w", "test.write", input={"token": {"from": "/data/token"}})]
    )
    eid = start_execution(runtime_engine, definition, {"token": secret})
    assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "FAILED"
    (row,) = attempt_history(runtime_engine, eid, "w")
    assert row.message.startswith("provider said no to [input] xxx")
    assert len(row.message) == 1024 and secret not in row.message
