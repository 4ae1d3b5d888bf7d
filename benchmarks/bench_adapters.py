"""The benchmark's adapters, declared IDEMPOTENT_WRITE so the full checkpoint path runs:
a no-op (inline, as the built-in noop), and one that takes `seconds` (a slow call holding
its worker slot, for the skewed-load run)."""

from __future__ import annotations

from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect


def _nothing(ctx: ActionContext) -> dict[str, Any]:
    return {"ok": True}


def _sleep(ctx: ActionContext) -> dict[str, Any]:
    # Waits on the stop event so a stopping worker is not held up by the sleep.
    ctx.stop_event.wait(float(ctx.inputs.get("seconds", 0.5)))
    return {"ok": True}


def register(registry: AdapterRegistry) -> None:
    registry.add(
        Adapter(
            capability="bench.noop",
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=5,
            max_attempts=3,
            invoke=_nothing,
            inline=True,  # it returns at once: no call thread needed, as the built-in noop
        )
    )
    registry.add(
        Adapter(
            capability="bench.sleep",
            version=1,
            effect=Effect.IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={"type": "object"},
            timeout_seconds=30,
            max_attempts=3,
            invoke=_sleep,
        )
    )
