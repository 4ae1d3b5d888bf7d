"""A rollout's rules in pure code: its limits as numbers, each item's machine and data, and
where a rollout stands (rollout@1; the SQL that applies them is in rollouts/)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from jsonpointer import JsonPointer, JsonPointerException

from orquestador.domain.statuses import RolloutChildStatus

# A limit given as a share of all items: "10%".
PERCENT = re.compile(r"^(\d{1,3})%$")
# A pointer into the item inside a string of the child's data: "{/item}", "{/item/name}".
ITEM_POINTER = re.compile(r"\{(/item(?:/[^{}]*)?)\}")


class ItemProblem(ValueError):
    """An item the child's data cannot be made from; its message says why, in words."""


def limit_of(value: int | str, total: int, *, minimum: int) -> int:
    """`batch` or `maxFailures` as a number: N, or "P%" of all `total` items.

    A batch of a percentage rounds up (10% of 5 is 1, never 0); a failure budget rounds
    down (10% of 15 allows 1 failure). Neither is below `minimum`.
    """
    if isinstance(value, int):
        return max(value, minimum)
    matched = PERCENT.match(value)
    if matched is None:
        raise ValueError(f"{value!r} is neither a number nor a percentage like '10%'")
    share = int(matched.group(1)) * total / 100
    return max(math.ceil(share) if minimum >= 1 else math.floor(share), minimum)


def machine_of(item: Any) -> str | None:
    """The machine an item names: the item itself, or its `machineId`."""
    if isinstance(item, str):
        return item or None
    if isinstance(item, dict) and isinstance(item.get("machineId"), str):
        return item["machineId"] or None
    return None


def child_data(template: Any, item: Any) -> Any:
    """The child's request data: `template` with its `{/item...}` pointers filled in.

    A string that is one pointer and nothing else becomes the value it points at (an
    object stays an object); a pointer inside longer text puts the value's text there.
    """
    if isinstance(template, dict):
        return {key: child_data(value, item) for key, value in template.items()}
    if isinstance(template, list):
        return [child_data(value, item) for value in template]
    if not isinstance(template, str):
        return template
    whole = ITEM_POINTER.fullmatch(template)
    if whole is not None:
        return _resolve(whole.group(1), item)

    def text_of(match: re.Match[str]) -> str:
        value = _resolve(match.group(1), item)
        if isinstance(value, dict | list):
            raise ItemProblem(f"{match.group(0)} is not text in the item: put it alone in a field")
        return value if isinstance(value, str) else _json_text(value)

    return ITEM_POINTER.sub(text_of, template)


def _resolve(pointer: str, item: Any) -> Any:
    try:
        return JsonPointer(pointer.removeprefix("/item")).resolve(item)
    except JsonPointerException:
        raise ItemProblem(f"the item has nothing at {pointer}") from None


def _json_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class RolloutCounts:
    """Where a rollout stands: its children by status, and what it may still start."""

    total: int
    started: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    max_failures: int
    stopped: bool = False  # cancelled by a person

    @property
    def budget_spent(self) -> bool:
        """Failures exceed `maxFailures`: no child starts any more."""
        return self.failed > self.max_failures

    @property
    def skipped(self) -> int:
        """Items that will never start: the budget is spent or the rollout was cancelled."""
        return self.total - self.started if self.budget_spent or self.stopped else 0

    @property
    def settled(self) -> bool:
        """Nothing runs and nothing more will start: the step can end."""
        return self.running == 0 and (
            self.started == self.total or self.budget_spent or self.stopped
        )

    def as_json(self) -> dict[str, int]:
        return {
            "total": self.total,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "skipped": self.skipped,
            "running": self.running,
            "maxFailures": self.max_failures,
        }


def play(total: int, batch: int, max_failures: int, outcomes: dict[int, str]) -> list[str]:
    """What a dry run's rollout does with `outcomes` (item index -> succeeded, failed or
    cancelled; succeeded when not given): each item's status, in order.

    The rehearsal lets children end in the order they started: item i starts once item
    i - batch has ended, and only while the failures among the ended ones are within the
    budget; once they are not, the rest are skipped. So, as in a real run, failures can end
    above the budget by the children already running.
    """
    statuses: list[str] = []
    for index in range(total):
        ended = statuses[: max(index - batch + 1, 0)]
        skipped = RolloutChildStatus.SKIPPED.value
        if ended.count(RolloutChildStatus.FAILED) > max_failures or skipped in statuses:
            statuses.append(skipped)
            continue
        statuses.append(outcomes.get(index, RolloutChildStatus.SUCCEEDED.value))
    return statuses
