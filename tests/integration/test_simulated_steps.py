"""Dry runs: the engine never calls a writer's invoke in a simulated execution, nor a
read's unless the read opts in (dry_run = "call")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect
from orquestador.actions.builtin import register_builtins
from orquestador.worker.executor import Executor
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    audit,
    checkpoints,
    execution,
    flow_definition,
    request_row,
    run_once,
    settings,
    start_execution,
)


def _refuse(ctx: ActionContext) -> dict[str, Any]:
    raise AssertionError("invoke was called in a dry run")


class Simulating:
    """A double whose simulate is recorded apart from its invoke."""

    def __init__(self, double: Double, output: dict[str, Any], summary: str | None = None):
        self.double = double
        self.output = output
        self.summary = summary
        self.calls: list[ActionContext] = []

    def simulate(self, ctx: ActionContext) -> dict[str, Any]:
        self.calls.append(ctx)
        if self.summary:
            ctx.observe({"summary": self.summary})
        return dict(self.output)


def _registry(*adapters: Any) -> AdapterRegistry:
    registry = AdapterRegistry()
    register_builtins(registry)
    for item in adapters:
        if isinstance(item, Simulating):
            registry.add(replace(item.double.adapter(), simulate=item.simulate))
        elif isinstance(item, Adapter):
            registry.add(item)
        else:
            registry.add(item.adapter())
    return registry


def test_a_dry_run_simulates_every_writer_and_never_invokes_one(runtime_engine):
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output=_refuse)
    notify = Double("test.notify", Effect.IDEMPOTENT_WRITE, output=_refuse)
    read = Double("test.read", Effect.READ_ONLY, output={"balance": 10})
    charging = Simulating(charge, {"invoiceId": "sim-1"}, summary="would charge 10 EUR")
    notifying = Simulating(notify, {"sent": False})
    reading = replace(read.adapter(), dry_run="call")
    executor = Executor(_registry(charging, notifying, reading), settings())
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [
                action("balance", "test.read"),
                action("charge", "test.charge"),
                action("tell", "test.notify"),
            ]
        ),
        simulation=True,
    )
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert charge.calls == [] and notify.calls == [], "a writer's invoke ran in a dry run"
    assert len(charging.calls) == 1 and len(notifying.calls) == 1
    assert charging.calls[0].simulation is True
    # A read that opts in (dry_run = "call") is called as it is.
    assert len(read.calls) == 1 and read.calls[0].simulation is True
    assert checkpoints(runtime_engine, eid)["charge"].output == {"invoiceId": "sim-1"}
    simulated = [row.detail for row in audit(runtime_engine, eid, "ACTION_SIMULATED")]
    assert simulated == [
        {
            "actionId": "charge",
            "capability": "test.charge",
            "version": 1,
            "effect": "NON_IDEMPOTENT_WRITE",
            "summary": "would charge 10 EUR",
        },
        {
            "actionId": "tell",
            "capability": "test.notify",
            "version": 1,
            "effect": "IDEMPOTENT_WRITE",
            "summary": "would call test.notify@1",
        },
    ]


def test_a_read_with_simulate_is_simulated_in_a_dry_run_and_invoked_otherwise(runtime_engine):
    read = Double("test.read", Effect.READ_ONLY, output={"real": True})
    reading = Simulating(read, {"real": False})
    executor = Executor(_registry(reading), settings())
    dry = start_execution(
        runtime_engine, flow_definition([action("r", "test.read")]), simulation=True
    )
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert (len(read.calls), len(reading.calls)) == (0, 1)
    assert [row.detail["actionId"] for row in audit(runtime_engine, dry, "ACTION_SIMULATED")] == [
        "r"
    ]
    real = start_execution(runtime_engine, flow_definition([action("r", "test.read")]))
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert (len(read.calls), len(reading.calls)) == (1, 1), "simulate ran outside a dry run"
    assert checkpoints(runtime_engine, real)["r"].output == {"real": True}
    assert audit(runtime_engine, real, "ACTION_SIMULATED") == []


def test_a_read_without_simulate_is_not_called_in_a_dry_run_unless_it_opts_in(runtime_engine):
    read = Double("test.read", Effect.READ_ONLY, output={"balance": 10})
    opted_in = Double("test.read", Effect.READ_ONLY, version=2, output={"balance": 20})
    executor = Executor(_registry(read, replace(opted_in.adapter(), dry_run="call")), settings())
    refused = start_execution(
        runtime_engine, flow_definition([action("r", "test.read")]), simulation=True
    )
    assert run_once(runtime_engine, executor) == "FAILED"
    assert read.calls == [], "a dry run called a read that did not opt in"
    assert execution(runtime_engine, refused).error_code == "SIMULATION_UNSUPPORTED"
    assert checkpoints(runtime_engine, refused)["r"].error_code == "SIMULATION_UNSUPPORTED"

    called = start_execution(
        runtime_engine, flow_definition([action("r", "test.read", 2)]), simulation=True
    )
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert len(opted_in.calls) == 1 and opted_in.calls[0].simulation is True
    assert checkpoints(runtime_engine, called)["r"].output == {"balance": 20}
    # A real read, not a simulated call: no ACTION_SIMULATED row.
    assert audit(runtime_engine, called, "ACTION_SIMULATED") == []


@pytest.mark.parametrize("effect", [Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE])
def test_a_writer_claiming_dry_run_call_past_the_contract_is_never_invoked(
    runtime_engine, effect: Effect
):
    # The contract refuses a writer that declares dry_run="call"; the engine does not
    # rely on that check: it refuses a writer's invoke in a dry run whatever it says.
    write = Double("test.write", effect, output=_refuse)
    adapter = write.adapter()
    object.__setattr__(adapter, "dry_run", "call")
    executor = Executor(_registry(adapter), settings())
    eid = start_execution(
        runtime_engine, flow_definition([action("w", "test.write")]), simulation=True
    )
    assert run_once(runtime_engine, executor) == "FAILED"
    assert write.calls == []
    assert execution(runtime_engine, eid).error_code == "SIMULATION_UNSUPPORTED"


def test_a_writer_without_simulate_fails_the_step_simulation_unsupported(runtime_engine):
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output=_refuse)
    executor = Executor(_registry(write), settings())
    eid = start_execution(
        runtime_engine, flow_definition([action("w", "test.write")]), simulation=True
    )
    assert run_once(runtime_engine, executor) == "FAILED"
    assert write.calls == []
    row = execution(runtime_engine, eid)
    assert row.error_code == "SIMULATION_UNSUPPORTED"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None
    assert checkpoints(runtime_engine, eid)["w"].error_code == "SIMULATION_UNSUPPORTED"
    assert audit(runtime_engine, eid, "ACTION_SIMULATED") == []


def test_simulation_unsupported_takes_the_error_exit_after_simulated_writes(runtime_engine):
    # An earlier simulated write wrote nothing: the declared exit is taken, no operator
    # is asked to reconcile a dry run.
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output=_refuse)
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output=_refuse)
    executor = Executor(_registry(Simulating(charge, {"id": "x"}), write), settings())
    eid = start_execution(
        runtime_engine,
        flow_definition(
            [action("charge", "test.charge"), action("w", "test.write", onError="attention")]
        ),
        simulation=True,
    )
    assert run_once(runtime_engine, executor) == "FAILED"
    assert write.calls == [] and charge.calls == []
    row = execution(runtime_engine, eid)
    assert (row.error_code, row.result["toState"]) == ("SIMULATION_UNSUPPORTED", "attention")
    (exit_row,) = audit(runtime_engine, eid, "STEP_ERROR_EXIT")
    assert exit_row.detail["actionId"] == "w"
    assert request_row(runtime_engine, row.request_id).state == "attention"


def test_a_failed_dry_run_after_a_simulated_write_is_failed_not_parked(runtime_engine):
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output=_refuse)
    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output=_refuse)
    executor = Executor(_registry(Simulating(charge, {"id": "x"}), write), settings())
    eid = start_execution(
        runtime_engine,
        flow_definition([action("charge", "test.charge"), action("w", "test.write")]),
        simulation=True,
    )
    assert run_once(runtime_engine, executor) == "FAILED"
    row = execution(runtime_engine, eid)
    assert row.error_code == "SIMULATION_UNSUPPORTED"
    assert request_row(runtime_engine, row.request_id).busy_execution_id is None


def test_a_simulated_call_that_breaks_is_retried_like_a_read(runtime_engine):
    charge = Double("test.charge", Effect.NON_IDEMPOTENT_WRITE, output=_refuse)
    attempts: list[int] = []

    def flaky(ctx: ActionContext) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        raise RuntimeError("simulator down")

    registry = _registry()
    registry.add(replace(charge.adapter(), simulate=flaky))
    executor = Executor(registry, settings())
    eid = start_execution(
        runtime_engine, flow_definition([action("c", "test.charge")]), simulation=True
    )
    # Not parked for a person: a simulated call cannot have written anything.
    assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    assert checkpoints(runtime_engine, eid)["c"].status == "FAILED"
    assert charge.calls == [] and attempts == [1]
