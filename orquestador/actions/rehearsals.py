"""Dry runs that rehearse every path: a step answers what the dry run's `outcomes` say.

`outcomes` maps an action id of the dry run's transition to one answer:

- `{"output": {...}}`: the step returns it (checked against the adapter's output schema
  like any output);
- `{"error": "CODE"}`: the step fails with that code, a declared failure, so the
  action's `onError` exit is taken as in a real run;
- `{"deadline": true}`: a step that waits with a deadline (approval@1, machine.wait@1)
  fails with its own deadline code;
- `{"decision": "approved" | "rejected"}`: an approval answers a person's decision;
- `{"children": {"INDEX": "succeeded" | "failed" | "cancelled"}}`: a rollout's children end
  so, by item index (the rest succeed), within the rollout's batch and failure budget.

Nothing outside is called for such a step, whatever its effect: the answer is the dry
run's, and the audit says it was rehearsed.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from orquestador.actions.builtin.approval import APPROVAL_DEADLINE_EXCEEDED
from orquestador.actions.builtin.approval import CAPABILITY as APPROVAL
from orquestador.actions.builtin.machine import WAIT_DEADLINE_EXCEEDED
from orquestador.actions.builtin.rollout import CAPABILITY as ROLLOUT
from orquestador.actions.contracts import ActionContext
from orquestador.actions.errors import PermanentError
from orquestador.domain.statuses import ApprovalStatus, RolloutChildStatus
from orquestador.errors import Problem

# The steps that wait with a deadline, and the code their deadline fails with.
DEADLINE_CODES = {APPROVAL: APPROVAL_DEADLINE_EXCEEDED, "machine.wait": WAIT_DEADLINE_EXCEEDED}
MAX_OUTCOMES = 100

OUTCOMES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "maxProperties": MAX_OUTCOMES,
    "description": "Per action id of the transition, the answer its step gives instead of "
    "being simulated: `{output}`, `{error: CODE}`, `{deadline: true}` (a step that waits "
    "with a deadline) or `{decision: approved | rejected}` (an approval).",
    "additionalProperties": {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
        "properties": {
            "output": {"type": "object"},
            "error": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]{0,63}$"},
            "deadline": {"const": True},
            "decision": {"enum": [ApprovalStatus.APPROVED, ApprovalStatus.REJECTED]},
            "children": {
                "type": "object",
                "maxProperties": 10_000,
                "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,4})$"},
                "additionalProperties": {
                    "enum": [
                        RolloutChildStatus.SUCCEEDED,
                        RolloutChildStatus.FAILED,
                        RolloutChildStatus.CANCELLED,
                    ]
                },
            },
        },
    },
}


def outcome_problems(
    outcomes: Mapping[str, Mapping[str, Any]], capabilities: Mapping[str, str]
) -> list[Problem]:
    """What is wrong with outcomes (already of OUTCOMES_SCHEMA's shape) for a transition
    whose actions are `capabilities` (action id -> capability)."""
    problems = []
    for action_id, outcome in outcomes.items():
        at = f"/outcomes/{action_id.replace('~', '~0').replace('/', '~1')}"
        capability = capabilities.get(action_id)
        if capability is None:
            problems.append(Problem(at, "the transition has no such action"))
        elif "deadline" in outcome and capability not in DEADLINE_CODES:
            problems.append(
                Problem(f"{at}/deadline", f"{capability} does not wait with a deadline")
            )
        elif "decision" in outcome and capability != APPROVAL:
            problems.append(Problem(f"{at}/decision", "only an approval takes a decision"))
        elif "children" in outcome and capability != ROLLOUT:
            problems.append(Problem(f"{at}/children", "only a rollout has children"))
    return problems


def describe(outcome: Mapping[str, Any]) -> str:
    """The outcome in words, for the dry run's audit."""
    if "output" in outcome:
        return "the output given"
    if "error" in outcome:
        return f"error {outcome['error']}"
    if "deadline" in outcome:
        return "the deadline passed"
    if "children" in outcome:
        return f"{len(outcome['children'])} children's outcomes given"
    return f"the decision {outcome['decision']}"


def rehearsed(
    outcome: Mapping[str, Any],
    capability: str,
    own: Callable[[ActionContext, Mapping[str, Any]], Any] | None = None,
) -> Callable[[ActionContext], Any]:
    """The call a step makes instead of its simulation: it answers `outcome`. An outcome
    only its adapter can play (a rollout's `children`) goes to the adapter's `rehearse`."""
    if "children" in outcome and own is not None:
        return lambda ctx: own(ctx, outcome)

    def play(ctx: ActionContext) -> Any:
        ctx.observe({"summary": f"rehearsed: {describe(outcome)}"})
        if "output" in outcome:
            return copy.deepcopy(outcome["output"])
        if "error" in outcome:
            raise PermanentError(outcome["error"], "rehearsed by the dry run")
        if "deadline" in outcome:
            raise PermanentError(
                DEADLINE_CODES[capability], "rehearsed by the dry run: the deadline passed"
            )
        return {
            "approvalId": str(uuid.uuid5(uuid.NAMESPACE_URL, ctx.external_key)),
            "decision": outcome["decision"],
            "by": "dry-run",
            "at": datetime.now(UTC).isoformat(),
            "comment": "rehearsed",
        }

    return play
