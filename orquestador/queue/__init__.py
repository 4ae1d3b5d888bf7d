"""The PostgreSQL queue protocol: claims, leases, fenced checkpoints and outcomes."""

from orquestador.queue.checkpoints import (
    ActionAttempt,
    CheckpointOutcome,
    end_attempt,
    record_found_write,
    start_checkpoint,
    succeed_checkpoint,
    write_attempt_outcome,
)
from orquestador.queue.claims import ClaimRound, claim_round
from orquestador.queue.fencing import Claim
from orquestador.queue.leases import release_lease, renew_leases
from orquestador.queue.loading import load_execution
from orquestador.queue.outcomes import (
    Finish,
    exit_on_error,
    fail_execution,
    finish_execution,
    require_reconciliation,
    schedule_retry,
)
from orquestador.queue.reconciliation import (
    RETRY_APPROVED,
    Resolution,
    cancel,
    resolve,
    step_in_doubt,
)
from orquestador.queue.snapshots import Checkpoint, LoadedExecution
from orquestador.queue.waits import park_waiting, wake_waiting

__all__ = [
    "RETRY_APPROVED",
    "ActionAttempt",
    "Checkpoint",
    "CheckpointOutcome",
    "Claim",
    "ClaimRound",
    "Finish",
    "LoadedExecution",
    "Resolution",
    "cancel",
    "claim_round",
    "end_attempt",
    "exit_on_error",
    "fail_execution",
    "finish_execution",
    "load_execution",
    "park_waiting",
    "record_found_write",
    "release_lease",
    "renew_leases",
    "require_reconciliation",
    "resolve",
    "schedule_retry",
    "start_checkpoint",
    "step_in_doubt",
    "succeed_checkpoint",
    "wake_waiting",
    "write_attempt_outcome",
]
