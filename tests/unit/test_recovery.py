"""The recovery rules as a table, one row per rule (SPEC 3, 15, 25), without PostgreSQL."""

from __future__ import annotations

import pytest

from orquestador.domain import recovery as r
from orquestador.domain.effects import Effect
from orquestador.domain.statuses import CheckpointStatus as S

READ, SAFE, CHARGE = Effect.READ_ONLY, Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE
NOT_ASKED, FOUND, NOT_FOUND, UNKNOWN = (
    r.LookUp.NOT_ASKED,
    r.LookUp.FOUND,
    r.LookUp.NOT_FOUND,
    r.LookUp.UNKNOWN,
)


def begun(status: S, effect: Effect, spent: int = 1, **extra: object) -> r.Begun:
    return r.Begun(status=status, effect=effect, attempts_in_budget=spent, max_attempts=3, **extra)


RECOVER = [
    # (rule, checkpoint found, look-up answer, decision)
    ("a success is reused, whatever the effect", begun(S.SUCCEEDED, CHARGE), NOT_ASKED, r.Reuse()),
    (
        "a result recorded for something else is never reused: a person decides",
        begun(S.SUCCEEDED, READ, mismatched=("inputHash",)),
        NOT_ASKED,
        r.Park(r.CONTRACT_MISMATCH),
    ),
    (
        "an operator's approved retry runs the step as it is now",
        begun(S.FAILED, CHARGE, mismatched=("inputHash",), retry_approved=True),
        NOT_ASKED,
        r.Run(),
    ),
    (
        "the next round of a wait runs, nothing spent",
        begun(S.FAILED, READ, 3, waiting=True),
        NOT_ASKED,
        r.Run(),
    ),
    ("a read left running runs again", begun(S.RUNNING, READ), NOT_ASKED, r.Run()),
    ("a safe write left running runs again, same key", begun(S.RUNNING, SAFE), NOT_ASKED, r.Run()),
    ("a failed attempt with budget left runs again", begun(S.FAILED, CHARGE), NOT_ASKED, r.Run()),
    (
        "a charge left running is looked up first",
        begun(S.RUNNING, CHARGE),
        NOT_ASKED,
        r.LookUpFirst(),
    ),
    ("a charge in doubt is looked up first", begun(S.UNKNOWN, CHARGE), NOT_ASKED, r.LookUpFirst()),
    ("a charge the provider has is taken as done", begun(S.RUNNING, CHARGE), FOUND, r.TakeFound()),
    (
        "a charge left running the provider lacks is settled once no call can send it",
        begun(S.RUNNING, CHARGE),
        NOT_FOUND,
        r.SettleNotFound(exhausted=False),
    ),
    (
        "... and fails when it was the budget's last attempt",
        begun(S.RUNNING, CHARGE, 3),
        NOT_FOUND,
        r.SettleNotFound(exhausted=True),
    ),
    (
        "a charge left running with no answer parks, its attempt ending UNKNOWN",
        begun(S.RUNNING, CHARGE),
        UNKNOWN,
        r.Park(r.INTERRUPTED_NON_IDEMPOTENT_WRITE, ends_as=S.UNKNOWN),
    ),
    (
        "a charge that ended UNKNOWN is not settled by a NotFound: it parks",
        begun(S.UNKNOWN, CHARGE),
        NOT_FOUND,
        r.Park(r.INTERRUPTED_NON_IDEMPOTENT_WRITE),
    ),
    (
        "a safe write left running with no attempt left is looked up first",
        begun(S.RUNNING, SAFE, 3),
        NOT_ASKED,
        r.LookUpFirst(),
    ),
    (
        "... and fails, its attempt ending UNKNOWN, when the provider cannot say",
        begun(S.RUNNING, SAFE, 3),
        UNKNOWN,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.UNKNOWN),
    ),
    (
        "a read left running with no attempt left fails, its attempt ending FAILED",
        begun(S.RUNNING, READ, 3),
        UNKNOWN,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED),
    ),
    (
        "a failed attempt with no budget left fails; nothing left running",
        begun(S.FAILED, SAFE, 3),
        NOT_ASKED,
        r.Fail(r.RETRIES_EXHAUSTED),
    ),
]


@pytest.mark.parametrize(
    ("rule", "found", "answer", "decision"), RECOVER, ids=[row[0] for row in RECOVER]
)
def test_recover(rule: str, found: r.Begun, answer: r.LookUp, decision: r.Decision) -> None:
    assert r.recover(found, answer) == decision


UNCERTAIN = [
    ("a read in doubt is retried as failed", READ, NOT_ASKED, r.Retry(S.FAILED)),
    ("a safe write in doubt is retried under its key", SAFE, NOT_ASKED, r.Retry(S.UNKNOWN)),
    ("a charge in doubt is looked up first", CHARGE, NOT_ASKED, r.LookUpFirst()),
    ("a charge found is taken", CHARGE, FOUND, r.TakeFound()),
    (
        "a charge not found is retried as failed",
        CHARGE,
        NOT_FOUND,
        r.Retry(S.FAILED, not_found=True),
    ),
    (
        "a charge nobody can settle parks, UNKNOWN",
        CHARGE,
        UNKNOWN,
        r.Park(r.UNCERTAIN_OUTCOME, ends_as=S.UNKNOWN),
    ),
]


@pytest.mark.parametrize(
    ("rule", "effect", "answer", "decision"), UNCERTAIN, ids=[row[0] for row in UNCERTAIN]
)
def test_after_uncertain_call(
    rule: str, effect: Effect, answer: r.LookUp, decision: r.Decision
) -> None:
    assert r.after_uncertain_call(effect, answer) == decision


def failed(
    status: S, attempt: int, *, writes: bool = True, runs: int = 1, **extra: bool
) -> r.Failed:
    return r.Failed(
        status=status,
        writes=writes,
        attempts_in_budget=attempt,
        max_attempts=3,
        execution_attempts=runs,
        execution_max_attempts=10,
        **extra,
    )


RETRY_OR_FAIL = [
    ("budget left: the next attempt", failed(S.UNKNOWN, 1), NOT_ASKED, r.Retry(S.UNKNOWN)),
    (
        "the execution's own budget spent: no next attempt",
        failed(S.FAILED, 1, runs=10),
        NOT_ASKED,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED),
    ),
    (
        "a last attempt that may have written is looked up first",
        failed(S.UNKNOWN, 3),
        NOT_ASKED,
        r.LookUpFirst(),
    ),
    (
        "a budget whose earlier attempts may have written is looked up first",
        failed(S.FAILED, 3),
        NOT_ASKED,
        r.LookUpFirst(),
    ),
    ("found: taken as done", failed(S.UNKNOWN, 3), FOUND, r.TakeFound()),
    (
        "not found: fails, settling the earlier attempts too",
        failed(S.UNKNOWN, 3),
        NOT_FOUND,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED, settles_earlier=True),
    ),
    (
        "no answer: fails as it was, the write rule deciding",
        failed(S.UNKNOWN, 3),
        UNKNOWN,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.UNKNOWN),
    ),
    (
        "a read is never looked up",
        failed(S.FAILED, 3, writes=False),
        NOT_ASKED,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED),
    ),
    (
        "a single attempt that failed cleanly wrote nothing: no look-up",
        r.Failed(S.FAILED, True, 1, 1, 1, 10),
        NOT_ASKED,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED),
    ),
    (
        "a not-found already known is not asked again",
        failed(S.FAILED, 3, not_found=True),
        NOT_ASKED,
        r.Fail(r.RETRIES_EXHAUSTED, ends_as=S.FAILED, settles_earlier=True),
    ),
]


@pytest.mark.parametrize(
    ("rule", "attempt", "answer", "decision"), RETRY_OR_FAIL, ids=[row[0] for row in RETRY_OR_FAIL]
)
def test_retry_or_fail(
    rule: str, attempt: r.Failed, answer: r.LookUp, decision: r.Decision
) -> None:
    assert r.retry_or_fail(attempt, answer) == decision
