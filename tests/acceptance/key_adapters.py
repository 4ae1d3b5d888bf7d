"""A step that takes a moment, for the concurrency-key crash test; each call is a ledger line.

Every call appends `start` and `end` lines with its machine and the wall clock, so the
test can check that no two calls on one machine overlapped. The victim's first call
blocks (after its `start` line) until the process is killed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect

LEDGER = os.environ.get("CRASH_LEDGER", "")
ROLE = os.environ.get("CRASH_ROLE", "")


def _record(ctx: ActionContext, event: str) -> None:
    line = json.dumps(
        {
            "role": ROLE,
            "key": ctx.external_key,
            "machine": ctx.inputs["machineId"],
            "event": event,
            "at": time.time(),
        }
    )
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def hold(ctx: ActionContext) -> dict[str, Any]:
    _record(ctx, "start")
    if ROLE == "victim":
        _record(ctx, "blocking")
        end = time.monotonic() + 60
        while time.monotonic() < end:  # killed with SIGKILL while here
            time.sleep(0.05)
    time.sleep(0.15)
    _record(ctx, "end")
    return {"ok": True}


def register(registry: AdapterRegistry) -> None:
    registry.add(
        Adapter(
            capability="crash.hold",
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema={
                "type": "object",
                "properties": {"machineId": {"type": "string"}},
                "required": ["machineId"],
            },
            output_schema={"type": "object"},
            timeout_seconds=5,
            max_attempts=3,
            invoke=hold,
        )
    )
