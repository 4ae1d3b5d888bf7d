"""What an adapter declares (capability, version, effect, schemas, limits) and what it receives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from orquestador.actions.errors import TransientError
from orquestador.actions.lookup import LookupResult
from orquestador.domain.effects import Effect

# What a dry run does with an adapter that has no simulate: refuse the step, or call it.
DryRun = Literal["simulate", "call"]
DRY_RUN_CHOICES: tuple[DryRun, ...] = ("simulate", "call")


@dataclass(frozen=True)
class RateLimit:
    """At most `per_second` calls a second on average, `burst` at once, across workers."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not self.per_second > 0:
            raise ValueError("rate limit: per_second must be greater than zero")
        if self.burst < 1:
            raise ValueError("rate limit: burst must be at least 1")


@dataclass(frozen=True)
class Identity:
    """The minimal identity an adapter may see: never tokens, ACLs or the actor snapshot."""

    org_id: str
    request_id: str
    execution_id: str
    actor: str | None = None


@dataclass(frozen=True)
class ActionContext:
    """Everything one adapter call receives; the external key is the provider's idempotency key."""

    inputs: dict[str, Any]
    external_key: str
    attempt: int
    deadline: float  # time.monotonic() seconds; the call must return before it
    identity: Identity
    simulation: bool = False
    stop_event: threading.Event = field(default_factory=threading.Event, repr=False)
    # When this step first started (database time), kept across retries, waits, crashes
    # and reclaims: a step with its own deadline (machine.wait) measures it from here.
    first_started_at: datetime | None = None
    # What the step saw of the world (e.g. {"commandId", "status", "seenAt"}); the engine
    # keeps it with the checkpoint and freezes it in the audit row that explains the
    # decision. Filled through observe().
    observed: dict[str, Any] = field(default_factory=dict, repr=False)

    def should_stop(self) -> bool:
        """True once the deadline passed, the lease was lost or the worker is stopping.

        Past the deadline nobody waits for the answer any more: the engine recorded the
        outcome as uncertain. Wrap up; do not start anything new.
        """
        return self.stop_event.is_set() or time.monotonic() >= self.deadline

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def check_deadline(self, what: str = "the call") -> None:
        """Raise TransientError once the deadline passed; call it immediately before the
        request leaves (the socket write, the committing transaction).

        Past the deadline the engine may have handed the step on: a worker that was
        paused (GC, a frozen VM) and then sends would write after another holder asked
        the provider and heard "not found". Nothing was sent, so it is safe to retry.
        """
        if time.monotonic() >= self.deadline:
            raise TransientError(f"the deadline passed before {what} was sent; nothing was sent")

    def deadline_text(self) -> str:
        """The deadline as wall-clock UTC in RFC 3339 (what `Request-Deadline` carries), so
        a provider can refuse a request that arrives after it."""
        at = datetime.now(UTC) + timedelta(seconds=self.deadline - time.monotonic())
        return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def observe(self, facts: dict[str, Any]) -> None:
        """Record what this step saw (no inputs, no secrets): shown as "then" on the page."""
        self.observed.clear()
        self.observed.update(facts)


@dataclass(frozen=True)
class Adapter:
    """A trusted, versioned integration; `invoke` returns the output or raises an action error.

    `lookup`, when declared, asks the provider whether the write keyed by
    `ctx.external_key` exists (Found, NotFound or Unknown); the worker asks it before
    leaving a write in doubt to a person. It gets its own `lookup_timeout_seconds`
    (default: `timeout_seconds`), below the lease like the call's.

    In a dry run the engine calls `simulate`; without one the step fails
    SIMULATION_UNSUPPORTED, unless a READ_ONLY adapter declares `dry_run="call"`: then
    its `invoke` runs for real, which is the operator's statement that calling it
    outside changes nothing and costs nothing.
    """

    capability: str
    version: int
    effect: Effect
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    timeout_seconds: float
    max_attempts: int
    invoke: Callable[[ActionContext], dict[str, Any]] = field(repr=False)
    simulation_only: bool = False
    lookup: Callable[[ActionContext], LookupResult] | None = field(default=None, repr=False)
    lookup_timeout_seconds: float | None = None
    # What a dry run calls instead of `invoke`: no side effect, returns the output the
    # step would have had. Without it a dry run's step fails SIMULATION_UNSUPPORTED; the
    # engine never calls a writer's `invoke` in one.
    simulate: Callable[[ActionContext], dict[str, Any]] | None = field(default=None, repr=False)
    # A dry run's outcome only this adapter can play (rollout@1's `children`): called with
    # the context and the outcome instead of `simulate` (actions/rehearsals.py).
    rehearse: Callable[[ActionContext, Mapping[str, Any]], dict[str, Any]] | None = field(
        default=None, repr=False
    )
    # "call" lets a dry run invoke a READ_ONLY adapter for real; by default nothing
    # outside is called in one (SPEC 16).
    dry_run: DryRun = "simulate"
    # Calls share one token bucket in the database (queue/rate_limits.py): a call with
    # no token waits RETRY_WAIT for the next one, spending no attempt.
    rate_limit: RateLimit | None = None
    # True: `invoke` (or `simulate`) returns at once and waits on nothing outside the
    # process (no network, no file, no lock another holds), so the job calls it on its
    # own thread instead of handing it to a call thread. Its deadline is checked when it
    # returns, with the same rule (an answer at or past it is late); nothing can abandon
    # it mid-call, so an inline adapter that blocks holds its job and its lease.
    inline: bool = False

    def __post_init__(self) -> None:
        # A frozen dataclass still accepts a plain string; keep the enum everywhere.
        object.__setattr__(self, "effect", Effect(self.effect))
        if self.dry_run not in DRY_RUN_CHOICES:
            raise ValueError(f"{self.key}: dry_run must be 'simulate' or 'call'")
        if self.dry_run == "call" and self.effect.writes:
            raise ValueError(
                f"{self.key}: dry_run='call' is for READ_ONLY adapters; a dry run never "
                "invokes one that writes (declare simulate instead)"
            )
        if self.dry_run == "call" and self.simulate is not None:
            # Both would answer the same dry run: say which one, by declaring only it.
            raise ValueError(f"{self.key}: declares both simulate and dry_run='call'")
        if self.timeout_seconds <= 0:
            raise ValueError(f"{self.key}: timeout_seconds must be positive (finite timeouts only)")
        if self.max_attempts < 1:
            raise ValueError(f"{self.key}: max_attempts must be at least 1")
        if self.lookup is None:
            if self.lookup_timeout_seconds is not None:
                raise ValueError(f"{self.key}: lookup_timeout_seconds is set but no lookup is")
            return
        if not callable(self.lookup):
            raise ValueError(f"{self.key}: lookup must be callable")
        if not self.effect.writes:
            raise ValueError(f"{self.key}: a READ_ONLY adapter has no write to look up")
        if self.lookup_timeout_seconds is None:
            object.__setattr__(self, "lookup_timeout_seconds", self.timeout_seconds)
        elif self.lookup_timeout_seconds <= 0:
            raise ValueError(
                f"{self.key}: lookup_timeout_seconds must be positive (finite timeouts only)"
            )

    @property
    def key(self) -> str:
        return f"{self.capability}@{self.version}"
