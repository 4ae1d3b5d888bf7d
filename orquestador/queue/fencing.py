"""The claim a worker holds, and the fence every holder write checks: owner, token, lease."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from orquestador.domain.statuses import ExecutionStatus
from orquestador.errors import LeaseLost
from orquestador.queue.snapshots import LoadedExecution

log = logging.getLogger(__name__)

# The actor of every audit row the worker writes.
WORKER_ACTOR = "system:worker"


@dataclass(frozen=True)
class Claim:
    """One execution this worker owns until the lease lapses or the token moves on."""

    execution_id: uuid.UUID
    token: int
    owner: str
    attempts: int
    max_attempts: int
    request_id: uuid.UUID
    lease_expires_at: datetime
    created_at: datetime
    claimed_at: datetime
    # The loaded execution, when the claim statement could read it (a first holder);
    # otherwise the worker loads under the fence. Not part of the claim's identity.
    snapshot: LoadedExecution | None = field(default=None, compare=False, repr=False)
    # The acceptance's W3C traceparent: this holder's spans continue its trace.
    trace_parent: str | None = field(default=None, compare=False, repr=False)
    # Whether the claim counted an attempt (it does for all but a wait's next round), as
    # the claimed row said: a rate limit's wait gives back exactly that.
    counted_attempt: bool = field(default=True, compare=False, repr=False)
    # Whether the claim took the execution over from a holder whose lease ran out: that
    # holder's last attempt never ended (see ATTEMPT_INTERRUPTED in queue/claims.py).
    reclaimed: bool = field(default=False, compare=False, repr=False)
    # When this process received the claim (time.monotonic()): with `claimed_at`, the
    # database's time now, without asking it (`database_now`).
    received: float = field(default_factory=time.monotonic, compare=False, repr=False)

    def database_now(self) -> datetime:
        """The database's time now, as its clock at the claim plus the time since here.

        A little early (by the claim's answer's trip), never later than the database's
        own clock_timestamp() at a write that follows.
        """
        return self.claimed_at + timedelta(seconds=time.monotonic() - self.received)

    @property
    def params(self) -> dict[str, Any]:
        """The bound parameters of the FENCE predicate."""
        return {"execution_id": self.execution_id, "owner": self.owner, "token": self.token}

    @property
    def log_extra(self) -> dict[str, Any]:
        return {"execution_id": str(self.execution_id), "token": self.token}


# Every write a holder makes carries this predicate. The token, not the owner name,
# is what tells a reclaimed execution apart; clock_timestamp() (not now(), frozen at
# transaction start) is the database's clock at the moment the row is checked.
FENCE = f"""
    e.id = :execution_id
    AND e.status = '{ExecutionStatus.RUNNING}'
    AND e.lease_owner = :owner
    AND e.fencing_token = :token
    AND e.lease_expires_at > clock_timestamp()
"""

_HOLDS = text(f"SELECT 1 FROM execution e WHERE {FENCE}")


def refuse_stale(claim: Claim, what: str) -> LeaseLost:
    """Log a refused stale write and build the LeaseLost to raise."""
    log.warning("stale holder refused: %s", what, extra={**claim.log_extra, "write": what})
    return LeaseLost(
        f"lease of execution {claim.execution_id} (token {claim.token}) is no longer "
        f"held; {what} refused"
    )


def still_holds(conn: Connection, claim: Claim) -> bool:
    """Whether the claim holds the lease now (explains a write that matched nothing)."""
    return conn.execute(_HOLDS, claim.params).first() is not None
