"""How long to wait after the n-th failure in a row: one formula, two jitter shapes.

Every retry in the product (an action's attempts, a claim or a loop that found the
database away, reconnects, the listener, the mailer, the agent) waits a capped exponential
delay, `base * 2**(n-1)` up to `cap`, and jitters it in one of two ways, chosen by what
the waiter must avoid:

- **full jitter**, uniform in [0, ceiling]: where many processes fail at the same moment
  and retry the same server (a provider's outage, a failover's reconnects). It spreads a
  burst the widest; a retry may come at once.
- **equal jitter**, uniform in [ceiling/2, ceiling]: where retrying at once is itself the
  harm (a loop or a listener whose database is away, the mailer, an agent whose API is
  down): never sooner than half the ceiling, still spread apart.

(The shapes and their names are those of "Exponential Backoff And Jitter", AWS
Architecture Blog, 2015.)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# 2**62 is still a finite float: bounding the exponent keeps a huge failure count from
# overflowing before the cap applies.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class Backoff:
    base_seconds: float
    cap_seconds: float

    def ceiling(self, failures: int) -> float:
        """The longest wait after `failures` failures in a row (1-based; 0 counts as 1)."""
        exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
        return min(self.cap_seconds, self.base_seconds * 2**exponent)

    def full_jitter(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Uniform in [0, ceiling]: a burst of retries spread the widest."""
        return rand() * self.ceiling(failures)

    def equal_jitter(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Uniform in [ceiling/2, ceiling]: never at once, still spread apart."""
        ceiling = self.ceiling(failures)
        return ceiling / 2 + rand() * ceiling / 2
