"""Rollouts under test: a child flow whose one step is a provider with a ledger, the parent
flow with its rollout@1 step, and a real worker in the test's process."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect, PermanentError
from orquestador.actions.builtin import register_builtins
from orquestador.worker.daemon import Worker
from tests.integration.worker_support import (
    accept_transition,
    action,
    create_request,
    flow_definition,
    publish_flow,
    settings,
)

PATCH = "rollout.patch"


@dataclass
class PatchProvider:
    """The change each child makes on its machine, with a ledger of every call's interval
    (monotonic clock) and the machines told to fail."""

    failing: frozenset[str] = frozenset()
    # Machines whose patch answers something the engine cannot judge: the child parks.
    uncertain: frozenset[str] = frozenset()
    seconds: float = 0.05
    ledger: list[tuple[str, float, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        machine = ctx.inputs["machineId"]
        began = time.monotonic()
        time.sleep(self.seconds)
        with self._lock:
            self.ledger.append((machine, began, time.monotonic()))
        if machine in self.uncertain:
            raise RuntimeError(f"no telling whether {machine} was patched")
        if machine in self.failing:
            raise PermanentError("PATCH_FAILED", f"the patch failed on {machine}")
        return {"patched": machine}

    def adapter(self) -> Adapter:
        return Adapter(
            capability=PATCH,
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=5,
            max_attempts=1,
            invoke=self.invoke,
        )

    def most_at_once(self) -> int:
        """The most calls whose intervals overlapped, by the ledger's timestamps."""
        edges = sorted(
            [(began, 1) for _, began, _ in self.ledger] + [(ended, -1) for *_, ended in self.ledger]
        )
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most


def rollout_registry(database: Any, provider: PatchProvider, **overrides: Any) -> AdapterRegistry:
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn, **overrides))
    registry.add(provider.adapter())
    return registry


def child_flow() -> dict[str, Any]:
    return flow_definition(
        [action("patch", PATCH, input={"machineId": {"from": "/data/machineId"}})],
        data_schema={
            "type": "object",
            "required": ["machineId"],
            "properties": {"machineId": {"type": "string"}},
        },
    )


def parent_flow(child_key: str, **rollout: Any) -> dict[str, Any]:
    """A flow whose `go` runs one rollout over /data/machines; failure goes to attention."""
    inputs = {
        "items": {"from": "/data/machines"},
        "flow": {"const": child_key},
        "transition": {"const": "go"},
        "data": {"const": {"machineId": "{/item}"}},
        "batch": {"const": 2},
        "maxFailures": {"const": 0},
    }
    inputs.update({name: {"const": value} for name, value in rollout.items()})
    return flow_definition([action("roll", "rollout", input=inputs, onError="attention")])


def start_rollout(engine: Engine, machines: list[Any], **rollout: Any) -> uuid.UUID:
    """Publish the child and parent flows and accept the parent's `go`; its execution id."""
    child = child_flow()
    publish_flow(engine, child)
    parent = publish_flow(engine, parent_flow(child["key"], **rollout))
    request_id = create_request(engine, parent, {"machines": machines})
    return accept_transition(engine, request_id)


@contextmanager
def running_worker(database: Any, registry: AdapterRegistry, **overrides: Any) -> Iterator[Worker]:
    from orquestador.db.engine import make_engine

    worker_settings = settings(database_url=database.runtime_dsn, **overrides)
    engine = make_engine(database.runtime_dsn, pool_size=12, max_overflow=4)
    worker = Worker(worker_settings, engine, registry)
    worker.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        worker.join(30)
        engine.dispose()


def children(engine: Engine, parent: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                """SELECT c.item_index, c.status, c.refusal, c.ended_at, e.id, e.status AS
                          execution_status, e.created_at, e.parent_execution_id, r.machine_id
                   FROM rollout_child c
                   LEFT JOIN execution e ON e.id = c.execution_id
                   LEFT JOIN request r ON r.id = c.request_id
                   WHERE c.parent_execution_id = :parent ORDER BY c.item_index"""
            ),
            {"parent": parent},
        ).all()
