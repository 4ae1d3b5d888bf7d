"""The benchmark's adapter: a no-op declared IDEMPOTENT_WRITE so the full checkpoint path runs."""

from __future__ import annotations

from typing import Any

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect


def _nothing(ctx: ActionContext) -> dict[str, Any]:
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
        )
    )
