"""rollout@1: one child request per item, at most `batch` at once, within a failure budget.

The first round writes the rollout (keyed by the step's external key, so every later
round, retry or holder finds the same one: the items frozen, the child flow's version
pinned). Each round starts what the rollout may start now, one committed transaction per
child (rollouts/store.py), then either ends the step or waits WAITING without a thread:
a child's end wakes it at once (the trigger of migration 0031), a pause between starts
by time. The step ends once nothing runs and nothing more will start: its output when
the budget held, else ROLLOUT_FAILURE_BUDGET (or ROLLOUT_CANCELLED) through the flow's
error exit, with the counts as what it saw.

Its writes are to this product's own database, keyed by the step's external key and the
item's index: repeating a round starts nothing twice, so it is declared READ_ONLY, the
only effect that may wait.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection

from orquestador.actions.builtin.database import BuiltinDatabase, builtin_timeout_seconds
from orquestador.actions.builtin.machine import MAX_MACHINE_ID_CHARACTERS, POLL_FALLBACK_SECONDS
from orquestador.actions.contracts import ActionContext, Adapter, Effect
from orquestador.actions.errors import NotReady, PermanentError
from orquestador.actions.registry import AdapterRegistry
from orquestador.automation.schedules import FlowNotFound, resolve_flow
from orquestador.config import Settings
from orquestador.domain.action_contracts import ConstantProblem
from orquestador.domain.flow_definition import FlowDefinition
from orquestador.domain.quotas import Quotas
from orquestador.domain.rollouts import (
    RolloutCounts,
    limit_of,
    machine_of,
    play,
)
from orquestador.domain.statuses import RolloutChildStatus
from orquestador.queue.open_executions import RecentRoom
from orquestador.rollouts.store import (
    RolloutDraft,
    children_of,
    find_rollout,
    open_rollout,
    read_counts,
    start_due_children,
    wait_key,
)

CAPABILITY = "rollout"
ROLLOUT_FAILURE_BUDGET = "ROLLOUT_FAILURE_BUDGET"
ROLLOUT_CANCELLED = "ROLLOUT_CANCELLED"
ROLLOUT_TOO_MANY_ITEMS = "ROLLOUT_TOO_MANY_ITEMS"
ROLLOUT_FLOW_UNKNOWN = "ROLLOUT_FLOW_UNKNOWN"
ROLLOUT_TRANSITION_INVALID = "ROLLOUT_TRANSITION_INVALID"
# A round hands on before its call's deadline, leaving at most this much time to park.
WRAP_UP_SECONDS = 2.0
MAX_PAUSE_SECONDS = 86_400

_PERCENT = r"^(100|[1-9]?[0-9])%$"
_MACHINE_ID: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_MACHINE_ID_CHARACTERS,
    "pattern": r"^[^\s]+$",
}

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["items", "flow", "transition", "data", "batch", "maxFailures"],
    "additionalProperties": False,
    "properties": {
        # Each a machine id, or an object naming one (its other fields for {/item/...}).
        "items": {
            "type": "array",
            "items": {
                "anyOf": [
                    _MACHINE_ID,
                    {
                        "type": "object",
                        "required": ["machineId"],
                        "properties": {"machineId": _MACHINE_ID},
                    },
                ]
            },
        },
        # The child flow's key (its latest version when the step starts) or a version id.
        "flow": {"type": "string", "minLength": 1, "maxLength": 200},
        "transition": {"type": "string", "minLength": 1, "maxLength": 100},
        # Each child's request data; its strings may hold {/item} and {/item/...} pointers.
        "data": {"type": "object"},
        "batch": {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": _PERCENT}]
        },
        "maxFailures": {
            "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": _PERCENT}]
        },
        "pauseBetweenSeconds": {"type": "number", "minimum": 0, "maximum": MAX_PAUSE_SECONDS},
    },
}

_CHILD: dict[str, Any] = {
    "type": "object",
    "required": ["item", "status"],
    "properties": {
        "item": True,
        "requestId": {"type": ["string", "null"]},
        "executionId": {"type": ["string", "null"]},
        "status": {"enum": [s.value for s in RolloutChildStatus]},
        "refusal": {"type": "string"},
    },
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["total", "succeeded", "failed", "cancelled", "skipped", "children"],
    "properties": {
        "total": {"type": "integer"},
        "succeeded": {"type": "integer"},
        "failed": {"type": "integer"},
        "cancelled": {"type": "integer"},
        "skipped": {"type": "integer"},
        "children": {"type": "array", "items": _CHILD},
    },
}


def too_many_items(count: int, limit: int) -> str:
    return (
        f"the rollout has {count:,} items; a rollout step runs over at most {limit:,} (the "
        "organization's quota rolloutItems): split it into several steps or requests"
    )


def constant_problem(limit: int) -> ConstantProblem:
    """Publishing refuses a constant list of items longer than the organization's quota
    rolloutItems."""

    def problem(name: str, value: Any) -> str | None:
        if name == "items" and isinstance(value, list) and len(value) > limit:
            return too_many_items(len(value), limit)
        return None

    return problem


class Rollouts:
    """The adapter's calls, on the built-ins' lazily made database; `quotas_for` gives an
    organization's quotas (rolloutItems, openExecutions)."""

    def __init__(
        self,
        database: BuiltinDatabase,
        *,
        max_attempts: int,
        quotas_for: Callable[[str], Quotas],
    ) -> None:
        self._database = database
        self._max_attempts = max_attempts
        self._quotas_for = quotas_for
        # The organizations lately found far below their quota openExecutions.
        self._recent = RecentRoom()

    def _room_for(self, org: str) -> Callable[[Connection], bool]:
        limit = self._quotas_for(org).open_executions
        return lambda conn: self._recent.used_if_full(conn, org, limit) is None

    def _check_items(self, org: str, items: list[Any]) -> None:
        limit = self._quotas_for(org).rollout_items
        if len(items) > limit:
            raise PermanentError(ROLLOUT_TOO_MANY_ITEMS, too_many_items(len(items), limit))

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        engine = self._database.engine
        # Time kept to read the counts and park; a short call (a short lease) keeps a
        # quarter of it, so it still starts children.
        wrap_up = min(WRAP_UP_SECONDS, ctx.seconds_left() / 4)
        with engine.begin() as conn:
            rollout = find_rollout(conn, ctx.external_key)
            if rollout is None:
                rollout = open_rollout(conn, self._draft(conn, ctx))
        start_due_children(
            engine,
            rollout,
            max_attempts=self._max_attempts,
            should_stop=lambda: ctx.should_stop() or ctx.seconds_left() < wrap_up,
            has_room=self._room_for(rollout.org_id),
        )
        with engine.connect() as conn:
            counts, now = read_counts(conn, rollout.id)
            seen = {"rolloutId": str(rollout.id), **counts.as_json()}
            if not counts.settled:
                conn.rollback()
                raise NotReady(
                    _check_again_in(now, counts), wait_key=wait_key(rollout.id), observed=seen
                )
            children = children_of(conn, rollout, counts)
        if counts.stopped:
            raise PermanentError(
                ROLLOUT_CANCELLED,
                f"the rollout was cancelled by {now.cancelled_by or 'an operator'}: "
                f"{counts.skipped} of {counts.total} items never started",
                observed=seen,
            )
        if counts.budget_spent:
            raise PermanentError(
                ROLLOUT_FAILURE_BUDGET,
                f"failures {counts.failed} of at most {counts.max_failures} allowed: "
                f"{counts.skipped} of {counts.total} items were skipped",
                observed=seen,
            )
        ctx.observe(seen)
        return {
            "total": counts.total,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "skipped": counts.skipped,
            "children": children,
        }

    def _draft(self, conn: Any, ctx: ActionContext) -> RolloutDraft:
        inputs, identity = ctx.inputs, ctx.identity
        items = list(inputs["items"])
        self._check_items(identity.org_id, items)
        flow_row, definition = _child_flow(conn, identity.org_id, inputs["flow"])
        transition = definition.transitions.get(inputs["transition"])
        if transition is None or not transition.leaves(definition.initial_state):
            raise PermanentError(
                ROLLOUT_TRANSITION_INVALID,
                f"flow {inputs['flow']!r} has no transition {inputs['transition']!r} from its "
                f"initial state {definition.initial_state!r}: each child is a new request",
            )
        total = len(items)
        return RolloutDraft(
            org_id=identity.org_id,
            request_id=uuid.UUID(identity.request_id),
            execution_id=uuid.UUID(identity.execution_id),
            action_id=ctx.external_key.split(":", 1)[-1],  # "<executionId>:<actionId>"
            external_key=ctx.external_key,
            flow_id=flow_row.id,
            transition_id=transition.id,
            items=items,
            data=dict(inputs["data"]),
            batch=limit_of(inputs["batch"], total, minimum=1),
            max_failures=limit_of(inputs["maxFailures"], total, minimum=0),
            pause_between_seconds=float(inputs.get("pauseBetweenSeconds", 0)),
        )

    def simulate(self, ctx: ActionContext) -> dict[str, Any]:
        """A dry run starts nothing: it says what it would start, every child succeeding."""
        return self._play(ctx, {})

    def rehearse(self, ctx: ActionContext, outcome: Mapping[str, Any]) -> dict[str, Any]:
        """A dry run's rollout whose children end as `outcome["children"]` says, by item
        index (the rest succeed)."""
        children = outcome.get("children", {})
        return self._play(ctx, {int(index): status for index, status in children.items()})

    def _play(self, ctx: ActionContext, outcomes: dict[int, str]) -> dict[str, Any]:
        """The rollout played in a dry run: it starts nothing real, says what it would
        start, and ends as the real step would with these children's ends."""
        items = list(ctx.inputs["items"])
        self._check_items(ctx.identity.org_id, items)
        with self._database.engine.connect() as conn:
            flow_row, _ = _child_flow(conn, ctx.identity.org_id, ctx.inputs["flow"])
        total = len(items)
        batch = limit_of(ctx.inputs["batch"], total, minimum=1)
        budget = limit_of(ctx.inputs["maxFailures"], total, minimum=0)
        statuses = play(total, batch, budget, outcomes)
        started = total - statuses.count(RolloutChildStatus.SKIPPED)
        machines = [machine_of(item) for item in items]
        counts = RolloutCounts(
            total=total,
            started=started,
            running=0,
            succeeded=statuses.count(RolloutChildStatus.SUCCEEDED),
            failed=statuses.count(RolloutChildStatus.FAILED),
            cancelled=statuses.count(RolloutChildStatus.CANCELLED),
            max_failures=budget,
        )
        seen = {
            "summary": (
                f"would start {started} of {total} child requests of {flow_row.key} "
                f"v{flow_row.version} ({ctx.inputs['transition']}), {batch} at a time, "
                f"stopping once failures exceed {budget}"
            ),
            "machines": machines[:50],
            **counts.as_json(),
        }
        if counts.budget_spent:
            raise PermanentError(
                ROLLOUT_FAILURE_BUDGET,
                f"rehearsed: failures {counts.failed} of at most {budget} allowed: "
                f"{counts.skipped} of {total} items would be skipped",
                observed=seen,
            )
        ctx.observe(seen)
        return {
            "total": total,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "skipped": counts.skipped,
            "children": [
                {"item": item, "requestId": None, "executionId": None, "status": status}
                for item, status in zip(items, statuses, strict=True)
            ],
        }


def _child_flow(conn: Any, org: str, named: str) -> tuple[Any, FlowDefinition]:
    try:
        row, _ = resolve_flow(conn, org=org, named=named)
    except FlowNotFound:
        raise PermanentError(
            ROLLOUT_FLOW_UNKNOWN, f"no flow {named!r} in this organization"
        ) from None
    return row, FlowDefinition.from_json(row.definition)


def _check_again_in(now: Any, counts: RolloutCounts) -> float:
    """A child's end wakes the parent by its key; time only for a pause between starts."""
    if (
        counts.running < now.batch
        and now.next_start_at is not None
        and now.next_start_at > now.read_at
    ):
        due = (now.next_start_at - now.read_at).total_seconds()
        return max(min(due, POLL_FALLBACK_SECONDS), 0.001)
    return POLL_FALLBACK_SECONDS


def register(registry: AdapterRegistry, settings: Settings, database: BuiltinDatabase) -> None:
    calls = Rollouts(
        database, max_attempts=settings.execution_max_attempts, quotas_for=settings.quotas_for
    )
    registry.add(
        Adapter(
            capability=CAPABILITY,
            version=1,
            effect=Effect.READ_ONLY,
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            timeout_seconds=builtin_timeout_seconds(settings.worker_lease_seconds),
            max_attempts=3,
            invoke=calls.invoke,
            simulate=calls.simulate,
            rehearse=calls.rehearse,
        )
    )
