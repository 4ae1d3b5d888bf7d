"""The engine's Prometheus series move when executions end, wait, retry or lose a lease."""

from __future__ import annotations

from prometheus_client import REGISTRY

from orquestador.actions import Effect, NotReady, TransientError
from orquestador.queue import cancel
from orquestador.worker.executor import LEASE_LOST, Executor
from tests.integration.worker_support import (
    ORG,
    action,
    claim_one,
    expire_lease,
    flow_definition,
    make_due,
    registry_of,
    run_once,
    settings,
    start_execution,
)
from tests.integration.worker_support import RecordingAdapter as Double


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_executions_actions_retries_and_lost_leases_are_counted(runtime_engine):
    def poll(ctx):
        if len(wait.calls) == 1:
            raise NotReady(3600)
        if len(wait.calls) == 2:
            raise TransientError("busy")
        return {"ok": True}

    wait = Double("test.metrics", Effect.READ_ONLY, output=poll)
    executor = Executor(registry_of(wait), settings(retry_base_seconds=0.001))
    before = {
        status: _value("orquestador_executions_total", status=status)
        for status in ("WAITING", "RETRY_WAIT", "SUCCEEDED", "CANCELLED")
    }
    durations = {
        outcome: _value(
            "orquestador_action_duration_seconds_count",
            capability="test.metrics@1",
            outcome=outcome,
        )
        for outcome in ("not_ready", "retry", "succeeded")
    }
    retries = _value("orquestador_retries_total", capability="test.metrics@1")
    lost = _value("orquestador_lease_lost_total")
    finished = {
        status: _value("orquestador_executions_finished_total", status=status)
        for status in ("SUCCEEDED", "CANCELLED")
    }

    eid = start_execution(runtime_engine, flow_definition([action("w", "test.metrics")]))
    assert run_once(runtime_engine, executor) == "WAITING"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    make_due(runtime_engine, eid)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"

    for status in ("WAITING", "RETRY_WAIT", "SUCCEEDED"):
        assert _value("orquestador_executions_total", status=status) == before[status] + 1
    # Three moves, one end: the finished counter counts the execution once, by how it ended,
    # and knows no status an execution does not end in.
    succeeded = _value("orquestador_executions_finished_total", status="SUCCEEDED")
    assert succeeded == finished["SUCCEEDED"] + 1
    assert (
        REGISTRY.get_sample_value("orquestador_executions_finished_total", {"status": "WAITING"})
        is None
    )
    for outcome in ("not_ready", "retry", "succeeded"):
        assert (
            _value(
                "orquestador_action_duration_seconds_count",
                capability="test.metrics@1",
                outcome=outcome,
            )
            == durations[outcome] + 1
        )
    assert _value("orquestador_retries_total", capability="test.metrics@1") == retries + 1

    # A holder whose lease ran out and was taken over learns it at its next write.
    start_execution(runtime_engine, flow_definition([action("w", "test.metrics")]))
    stale = claim_one(runtime_engine, "stale")
    expire_lease(runtime_engine, stale.execution_id)
    claim_one(runtime_engine, "new")
    with runtime_engine.connect() as conn:
        assert executor.run(conn, stale) == LEASE_LOST
    assert _value("orquestador_lease_lost_total") == lost + 1

    pending = start_execution(runtime_engine, flow_definition([action("w", "test.metrics")]))
    with runtime_engine.connect() as conn:
        cancel(conn, pending, org_id=ORG, actor="user-1", reason="changed my mind")
    assert _value("orquestador_executions_total", status="CANCELLED") == before["CANCELLED"] + 1
    cancelled = _value("orquestador_executions_finished_total", status="CANCELLED")
    assert cancelled == finished["CANCELLED"] + 1
