"""Concurrency keys: what a transition's `concurrency` reads, checked at publish and at acceptance.

`"concurrency": {"key": "/data/machineId", "limit": 1}` on a transition: at most `limit`
executions of one organization hold the value the pointer reads from the request data
when the transition is accepted, from their first claim until they end (SPEC 19). The
key is the value itself, so two flows that key on the same machine exclude each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orquestador.domain.action_contracts import output_can_have
from orquestador.domain.mappings import find, pointer_parts
from orquestador.errors import Problem

MAX_KEY_LENGTH = 200
DEFAULT_PRIORITY = 5


@dataclass(frozen=True)
class Concurrency:
    """A transition's concurrency declaration, as published."""

    pointer: str
    limit: int

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> Concurrency | None:
        if raw is None:
            return None
        return cls(pointer=raw["key"], limit=int(raw.get("limit", 1)))


def key_pointer_problem(pointer: str, data_schema: Any) -> str | None:
    """Why `pointer` cannot name a key at acceptance, or None.

    Only the request data exists then; a read the flow's dataSchema rules out for every
    request could never give a key.
    """
    try:
        parts = pointer_parts(pointer)
    except ValueError as exc:
        return str(exc)
    if len(parts) < 2 or parts[0] != "data":
        return (
            f"{pointer} must read the request data (/data/...): nothing else exists"
            " when the transition is accepted"
        )
    if data_schema is not None and not output_can_have(data_schema, parts[1:]):
        return f"{pointer} reads a field the flow's dataSchema rules out"
    return None


class KeyMissing(Exception):
    """The request data gives the transition no usable key; `problem` says where and why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def key_value(concurrency: Concurrency, data: Any) -> str:
    """The key the request data gives: a string as it is, another value as its JSON text."""
    parts = pointer_parts(concurrency.pointer)
    found, value = find({"data": data}, parts)
    if not found or value is None:
        raise KeyMissing(
            Problem(
                concurrency.pointer,
                "the transition's concurrency key reads this, and the request data has "
                + ("null here" if found else "nothing here"),
            )
        )
    if isinstance(value, str):
        key = value
    else:
        key = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if not key or len(key) > MAX_KEY_LENGTH:
        raise KeyMissing(
            Problem(
                concurrency.pointer,
                f"a concurrency key has 1 to {MAX_KEY_LENGTH} characters;"
                f" this value has {len(key)}",
            )
        )
    return key
