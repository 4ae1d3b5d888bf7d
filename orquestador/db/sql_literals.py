"""Statuses as SQL literals: SQL text names each status by its enum member and still comes
out as if spelled by hand (a partial index's predicate matches a literal, never a bound
parameter, so the planner keeps using the index)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from orquestador.domain.statuses import in_order


def quoted(members: Iterable[StrEnum]) -> str:
    """`'PENDING', 'RETRY_WAIT'`, the inside of an IN list: a set in its enum's order, a
    tuple or list in its own."""
    listed = list(members) if isinstance(members, tuple | list) else in_order(members)
    return ", ".join(f"'{member.value}'" for member in listed)
