"""What a worker does with a step it finds begun, or whose call may have written.

The recovery rules of SPEC 3, 15 and 25 as pure functions: from what the checkpoint says
(its status, the adapter's effect, the attempts spent) and, once asked, what the provider's
look-up answered, to one decision. `worker/step_outcomes.py` carries decisions out (the
look-up, the SQL, the call); it decides nothing itself. `tests/unit/test_recovery.py`
holds a row per rule.

The write rule underneath all of them: a step that may have written is repeated only when
repeating it is safe (the adapter's effect says so, or the provider said the write did not
happen), and a NON_IDEMPOTENT_WRITE in doubt is never repeated: a person decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orquestador.domain.effects import Effect
from orquestador.domain.statuses import CheckpointStatus

# Why an execution parks or fails (its error code).
CONTRACT_MISMATCH = "CONTRACT_MISMATCH"
INTERRUPTED_NON_IDEMPOTENT_WRITE = "INTERRUPTED_NON_IDEMPOTENT_WRITE"
UNCERTAIN_OUTCOME = "UNCERTAIN_OUTCOME"
RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"


class LookUp(StrEnum):
    """What the provider answered when asked for a write under the step's external key."""

    NOT_ASKED = "NOT_ASKED"
    FOUND = "FOUND"  # it happened: its output is the step's
    NOT_FOUND = "NOT_FOUND"  # it did not happen (proof only once no call can still send it)
    UNKNOWN = "UNKNOWN"  # no look-up, or no answer: still in doubt


def interrupted_status(effect: Effect) -> CheckpointStatus:
    """How an attempt whose outcome nobody saw ends: a read changed nothing, a write may
    have."""
    return CheckpointStatus.FAILED if effect is Effect.READ_ONLY else CheckpointStatus.UNKNOWN


# --- decisions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reuse:
    """The step succeeded before: its recorded output is the step's; nothing is called."""


@dataclass(frozen=True)
class Run:
    """Call the adapter (a new attempt, or the next round of a wait)."""


@dataclass(frozen=True)
class LookUpFirst:
    """Ask the provider under the external key before deciding."""


@dataclass(frozen=True)
class TakeFound:
    """The look-up found the write: its output is the step's."""


@dataclass(frozen=True)
class SettleNotFound:
    """An earlier holder's RUNNING attempt that the provider does not have: once that call
    can no longer send (its start + timeout + grace, by the database's clock; until then
    the execution waits, no attempt spent), the attempt ends FAILED; then the step fails
    when no attempt is left, else runs again."""

    exhausted: bool


@dataclass(frozen=True)
class Retry:
    """End this attempt with `status` and schedule the next one."""

    status: CheckpointStatus
    not_found: bool = False  # the look-up already said the write did not happen


@dataclass(frozen=True)
class Park:
    """Stop for a person (RECONCILIATION_REQUIRED); a RUNNING attempt ends `ends_as`."""

    reason: str
    ends_as: CheckpointStatus | None = None


@dataclass(frozen=True)
class Fail:
    """Fail the execution; a RUNNING attempt ends `ends_as`. `settles_earlier`: the
    look-up proved the budget's earlier attempts wrote nothing either."""

    code: str
    ends_as: CheckpointStatus | None = None
    settles_earlier: bool = False


Decision = Reuse | Run | LookUpFirst | TakeFound | SettleNotFound | Retry | Park | Fail


# --- a step found begun ------------------------------------------------------------------


@dataclass(frozen=True)
class Begun:
    """A step's checkpoint as the holder about to run the step finds it."""

    status: CheckpointStatus
    effect: Effect
    attempts_in_budget: int  # attempts of this step's budget already spent
    max_attempts: int  # the adapter's
    mismatched: tuple[str, ...] = ()  # contract fields recorded differently (inputHash…)
    retry_approved: bool = False  # an operator discarded this checkpoint: run as it is now
    waiting: bool = False  # between two rounds of a wait: the same attempt goes on


def recover(begun: Begun, answer: LookUp = LookUp.NOT_ASKED) -> Decision:
    """The recovery rules for a checkpoint found on claiming (SPEC 3, 15, 25)."""
    if begun.mismatched and not begun.retry_approved:
        # Never reuse (or overwrite) a result recorded for something else.
        return Park(CONTRACT_MISMATCH)
    if begun.status is CheckpointStatus.SUCCEEDED:
        return Reuse()
    if begun.waiting:
        return Run()  # nothing spent, nothing to settle
    running = begun.status is CheckpointStatus.RUNNING
    interrupted = running or begun.status is CheckpointStatus.UNKNOWN
    exhausted = begun.attempts_in_budget >= begun.max_attempts
    non_idempotent = begun.effect is Effect.NON_IDEMPOTENT_WRITE
    if interrupted and (non_idempotent or exhausted):
        # A write in doubt is about to be parked (a non-idempotent one always, a safe one
        # by the write rule once out of attempts): ask the provider first.
        if answer is LookUp.NOT_ASKED:
            return LookUpFirst()
        if answer is LookUp.FOUND:
            return TakeFound()
    if answer is LookUp.NOT_FOUND and running:
        # An earlier holder's attempt: that holder may only be paused, its request not sent
        # yet; NotFound is proof once its call can no longer send.
        return SettleNotFound(exhausted=exhausted)
    if interrupted and non_idempotent:
        # Never repeated. An UNKNOWN attempt already ended (and is in the history); a
        # NotFound cannot settle it without restarting the budget, so it is parked too.
        return Park(
            INTERRUPTED_NON_IDEMPOTENT_WRITE,
            ends_as=CheckpointStatus.UNKNOWN if running else None,
        )
    if exhausted:
        return Fail(
            RETRIES_EXHAUSTED, ends_as=interrupted_status(begun.effect) if running else None
        )
    return Run()


# --- a call whose outcome is uncertain ---------------------------------------------------


def after_uncertain_call(effect: Effect, answer: LookUp = LookUp.NOT_ASKED) -> Decision:
    """A call that timed out or broke off may have written: look it up, retry, or park."""
    if effect is Effect.NON_IDEMPOTENT_WRITE:
        if answer is LookUp.NOT_ASKED:
            return LookUpFirst()
        if answer is LookUp.FOUND:
            return TakeFound()
        if answer is LookUp.NOT_FOUND:
            # It did not happen: the next attempt is as safe as after a TransientError.
            return Retry(CheckpointStatus.FAILED, not_found=True)
        return Park(UNCERTAIN_OUTCOME, ends_as=CheckpointStatus.UNKNOWN)
    # Safe to repeat with the same external key; the provider deduplicates writes.
    return Retry(interrupted_status(effect))


# --- an attempt that failed --------------------------------------------------------------


@dataclass(frozen=True)
class Failed:
    """An attempt that ended without success, as the next decision needs it."""

    status: CheckpointStatus  # FAILED (nothing written) or UNKNOWN (may have written)
    writes: bool  # the step's risk: a simulated call writes nothing
    attempts_in_budget: int  # this one included (1-based): the budget's attempts spent
    max_attempts: int  # the adapter's
    execution_attempts: int  # the execution's claims so far
    execution_max_attempts: int
    not_found: bool = False  # a look-up already said the write did not happen


def retry_or_fail(failed: Failed, answer: LookUp = LookUp.NOT_ASKED) -> Decision:
    """Schedule the next attempt while both budgets allow; else fail, after asking the
    provider when one of the budget's attempts may have written (the write rule would
    otherwise park the execution)."""
    if failed.attempts_in_budget < failed.max_attempts and (
        failed.execution_attempts < failed.execution_max_attempts
    ):
        return Retry(failed.status, not_found=failed.not_found)
    may_have_written = failed.status is CheckpointStatus.UNKNOWN or failed.attempts_in_budget > 1
    if not failed.not_found and failed.writes and may_have_written:
        if answer is LookUp.NOT_ASKED:
            return LookUpFirst()
        if answer is LookUp.FOUND:
            return TakeFound()
        if answer is LookUp.NOT_FOUND:
            return Fail(RETRIES_EXHAUSTED, ends_as=CheckpointStatus.FAILED, settles_earlier=True)
    return Fail(RETRIES_EXHAUSTED, ends_as=failed.status, settles_earlier=failed.not_found)
