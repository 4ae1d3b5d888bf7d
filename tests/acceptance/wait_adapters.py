"""A wait with its own deadline for the crash test; each round is appended to a ledger file.

The victim blocks in its third round (after two NotReady rounds) until it is killed.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    NotReady,
    PermanentError,
)

LEDGER = os.environ.get("CRASH_LEDGER", "")
ROLE = os.environ.get("CRASH_ROLE", "")
DEADLINE = timedelta(seconds=float(os.environ.get("WAIT_DEADLINE_SECONDS", "6")))


def _record(ctx: ActionContext, event: str) -> None:
    started = ctx.first_started_at
    line = json.dumps(
        {
            "role": ROLE,
            "key": ctx.external_key,
            "attempt": ctx.attempt,
            "firstStartedAt": started.isoformat() if started else None,
            "event": event,
            "at": datetime.now(UTC).isoformat(),
        }
    )
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _rounds(role: str) -> int:
    with open(LEDGER) as ledger:
        return sum(1 for line in ledger if json.loads(line)["role"] == role)


def wait(ctx: ActionContext) -> dict[str, Any]:
    assert ctx.first_started_at is not None
    seen = {"commandId": "c-1", "status": "sent", "seenAt": datetime.now(UTC).isoformat()}
    if datetime.now(UTC) - ctx.first_started_at >= DEADLINE:
        _record(ctx, "deadline")
        raise PermanentError("WAIT_DEADLINE_EXCEEDED", observed=seen)
    _record(ctx, "round")
    if ROLE == "victim" and _rounds("victim") >= 3:
        _record(ctx, "blocking")
        end = time.monotonic() + 60
        while time.monotonic() < end:  # killed with SIGKILL while here
            time.sleep(0.05)
    raise NotReady(0.2, wait_key="machine_command:c-1", observed=seen)


def register(registry: AdapterRegistry) -> None:
    registry.add(
        Adapter(
            capability="crash.wait",
            version=1,
            effect=Effect.READ_ONLY,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=2,
            max_attempts=3,
            invoke=wait,
        )
    )
