"""NO_OP: does nothing, for dry runs and benchmarks only; refuses a real execution."""

from __future__ import annotations

from typing import Any

from orquestador.actions.contracts import ActionContext, Adapter, Effect
from orquestador.actions.errors import PermanentError

SIMULATION_ONLY = "SIMULATION_ONLY"


def run_noop(ctx: ActionContext) -> dict[str, Any]:
    # The worker refuses simulation-only adapters before calling them; this is the
    # second lock on the same door, for anyone who calls the adapter directly.
    if not ctx.simulation:
        raise PermanentError(SIMULATION_ONLY, "noop runs only in a simulation")
    return {}


NOOP = Adapter(
    capability="noop",
    version=1,
    effect=Effect.READ_ONLY,
    input_schema={"type": "object"},
    output_schema={"type": "object"},
    timeout_seconds=1,
    max_attempts=1,
    invoke=run_noop,
    simulation_only=True,
    # Its invoke does nothing and reaches nothing, so a dry run may call it as it is.
    dry_run="call",
    inline=True,
)
