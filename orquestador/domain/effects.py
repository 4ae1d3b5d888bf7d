"""How safe it is to call an adapter again: the one word recovery decides by."""

from __future__ import annotations

import enum


class Effect(enum.StrEnum):
    """Declared by the adapter, never by the flow."""

    READ_ONLY = "READ_ONLY"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"
    NON_IDEMPOTENT_WRITE = "NON_IDEMPOTENT_WRITE"

    @property
    def writes(self) -> bool:
        return self is not Effect.READ_ONLY
