"""Adapters for the read crash test: reads whose calls are appended to the crash ledger.

`crash.look` blocks in the victim (killed there with SIGKILL); `crash.peek` does not.
Their timeout (8 s) is below the lease the test gives the workers.
"""

from __future__ import annotations

import time
from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect
from tests.acceptance.crash_adapters import ROLE, _record


def _read(capability: str, blocks: bool) -> Adapter:
    def invoke(ctx: ActionContext) -> dict[str, Any]:
        _record(ctx, capability, "start")
        if blocks and ROLE == "victim":
            end = time.monotonic() + 120
            while time.monotonic() < end:
                time.sleep(0.05)
        _record(ctx, capability, "end")
        return {"key": ctx.external_key}

    return Adapter(
        capability=capability,
        version=1,
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        timeout_seconds=8,
        max_attempts=3,
        invoke=invoke,
    )


def register(registry: AdapterRegistry) -> None:
    registry.add(_read("crash.peek", blocks=False))
    registry.add(_read("crash.look", blocks=True))
