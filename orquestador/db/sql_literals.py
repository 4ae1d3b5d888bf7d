"""Statuses as SQL literals: SQL text names each status by its enum member and still comes
out as if spelled by hand (a partial index's predicate matches a literal, never a bound
parameter, so the planner keeps using the index)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


def quoted(members: Iterable[StrEnum]) -> str:
    """`'PENDING', 'RETRY_WAIT'`, the inside of an IN list: a set in its enum's order, a
    tuple or list in its own."""
    listed = list(members)
    if not isinstance(members, tuple | list):
        listed.sort(key=lambda member: list(type(member)).index(member))
    return ", ".join(f"'{member.value}'" for member in listed)
