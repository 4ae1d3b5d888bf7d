"""An organization's quotas: their names, the defaults from settings, ORG_QUOTAS overrides.

Pure: the settings hand in the defaults and the raw ORG_QUOTAS text; the SQL that counts
use against a limit lives with the table it counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

# The names the API, ORG_QUOTAS and the problems use, and the field each one sets.
QUOTA_FIELDS = {
    "schedules": "schedules",
    "scheduleMinSeconds": "schedule_min_seconds",
    "transitionsPerSecond": "transitions_per_second",
    "transitionsBurst": "transitions_burst",
    "openExecutions": "open_executions",
    "bulkItems": "bulk_items",
    "rolloutItems": "rollout_items",
}
# No limit worth the name goes beyond this (and a JSON number stays an exact integer).
MAX_QUOTA = 1_000_000_000


@dataclass(frozen=True)
class Quotas:
    """One organization's limits."""

    schedules: int
    schedule_min_seconds: int
    # Transitions asked for, on average a second and at once (a token bucket).
    transitions_per_second: int
    transitions_burst: int
    # Executions not ended yet (parked ones too), at once.
    open_executions: int
    # Executions one bulk action may take.
    bulk_items: int
    # Items one rollout step may run over.
    rollout_items: int

    def overridden(self, overrides: dict[str, int]) -> Quotas:
        return replace(self, **{QUOTA_FIELDS[name]: value for name, value in overrides.items()})

    def as_json(self) -> dict[str, int]:
        return {name: getattr(self, attribute) for name, attribute in QUOTA_FIELDS.items()}


def parse_org_quotas(raw: str) -> tuple[dict[str, dict[str, int]], list[str]]:
    """ORG_QUOTAS text (`{"acme": {"schedules": 500}}`) as {organization: {quota: limit}},
    and one line per problem."""
    if not raw.strip():
        return {}, []
    try:
        document: Any = json.loads(raw)
    except json.JSONDecodeError as error:
        return {}, [f"not JSON ({error.msg})"]
    if not isinstance(document, dict):
        return {}, ['a JSON object of organizations, e.g. {"acme": {"schedules": 500}}']
    parsed: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for org, limits in document.items():
        if not isinstance(limits, dict):
            problems.append(f'{org!r}: an object of quotas, e.g. {{"schedules": 500}}')
            continue
        kept: dict[str, int] = {}
        for name, value in limits.items():
            if name not in QUOTA_FIELDS:
                known = ", ".join(QUOTA_FIELDS)
                problems.append(f"{org!r}: unknown quota {name!r} (known: {known})")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{org!r}: {name} must be a whole number, 0 or more")
            elif value > MAX_QUOTA:
                problems.append(f"{org!r}: {name} must be at most {MAX_QUOTA}")
            else:
                kept[name] = value
        parsed[org] = kept
    return parsed, problems
