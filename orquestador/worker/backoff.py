"""An action's retry delays: the shared backoff with full jitter, or a bounded Retry-After."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from orquestador.backoff import Backoff
from orquestador.config import Settings


@dataclass(frozen=True)
class RetryPolicy:
    base_seconds: float
    cap_seconds: float
    retry_after_min_seconds: float
    retry_after_max_seconds: float

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(
            settings.retry_base_seconds,
            settings.retry_cap_seconds,
            settings.retry_after_min_seconds,
            settings.retry_after_max_seconds,
        )

    def ceiling(self, attempt: int) -> float:
        """The largest delay after failed attempt number `attempt` (1-based)."""
        return Backoff(self.base_seconds, self.cap_seconds).ceiling(attempt)

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before the next attempt.

        A provider's Retry-After wins, clamped to the configured bounds so that a
        hostile or broken value neither hammers it nor parks work for days. Otherwise
        full jitter spreads the retries of a provider's outage apart (`orquestador.backoff`).
        """
        if retry_after is not None:
            return min(max(retry_after, self.retry_after_min_seconds), self.retry_after_max_seconds)
        return Backoff(self.base_seconds, self.cap_seconds).full_jitter(attempt, rand)
