"""Adapters for the crash test: every call is appended to a ledger file; the victim blocks."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect

LEDGER = os.environ.get("CRASH_LEDGER", "")
ROLE = os.environ.get("CRASH_ROLE", "")


def _record(ctx: ActionContext, capability: str, event: str) -> None:
    line = json.dumps(
        {
            "pid": os.getpid(),
            "role": ROLE,
            "key": ctx.external_key,
            "capability": capability,
            "attempt": ctx.attempt,
            "event": event,
        }
    )
    # One short O_APPEND write per line: lines from both processes never interleave.
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _adapter(capability: str, effect: Effect, blocks: bool) -> Adapter:
    def invoke(ctx: ActionContext) -> dict[str, Any]:
        _record(ctx, capability, "start")
        if blocks and ROLE == "victim":
            # The victim is killed with SIGKILL while it waits here.
            end = time.monotonic() + 120
            while time.monotonic() < end:
                time.sleep(0.05)
        _record(ctx, capability, "end")
        return {"key": ctx.external_key}

    return Adapter(
        capability=capability,
        version=1,
        effect=effect,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        timeout_seconds=2,
        max_attempts=3,
        invoke=invoke,
    )


def register(registry: AdapterRegistry) -> None:
    registry.add(_adapter("crash.write", Effect.IDEMPOTENT_WRITE, blocks=False))
    registry.add(_adapter("crash.hold", Effect.IDEMPOTENT_WRITE, blocks=True))
    registry.add(_adapter("crash.charge", Effect.NON_IDEMPOTENT_WRITE, blocks=True))
