"""The crash test's rollout: a child step that appends to a ledger file, and a victim that
blocks inside the start transaction of the rollout's fourth child until it is killed."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect
from orquestador.rollouts import store

LEDGER = os.environ.get("CRASH_LEDGER", "")
ROLE = os.environ.get("CRASH_ROLE", "")
BLOCK_AT_ITEM = 3


def _record(**event: Any) -> None:
    line = json.dumps({"role": ROLE, **event})
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def patch(ctx: ActionContext) -> dict[str, Any]:
    _record(event="patched", machine=ctx.inputs["machineId"], key=ctx.external_key)
    return {"patched": ctx.inputs["machineId"]}


def _block_in_the_start_of(item_index: int) -> None:
    _record(event="child written", item=item_index)
    if ROLE == "victim" and item_index == BLOCK_AT_ITEM:
        _record(event="blocking", item=item_index)
        end = time.monotonic() + 60
        while time.monotonic() < end:  # killed with SIGKILL while here, before COMMIT
            time.sleep(0.05)


def register(registry: AdapterRegistry) -> None:
    store.before_child_commit = _block_in_the_start_of
    registry.add(
        Adapter(
            capability="rollout.patch",
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=5,
            max_attempts=3,
            invoke=patch,
        )
    )
