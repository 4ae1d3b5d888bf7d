"""The promise checker's rate-limit invariant (8) reads the provider's ledger as it should."""

from __future__ import annotations

from collections import defaultdict

from tests.acceptance.provider_double import WRITES, LedgerLine
from tests.promise.adapters import WRITES_RATE_LIMIT
from tests.promise.invariants import RATE_MARGIN_SECONDS, rate_limit_held
from tests.promise.records import Records

EXECUTION = "00000000-0000-0000-0000-000000000001"


def _records(*sent: float, lookup: bool = False) -> Records:
    records = Records.__new__(Records)
    records.by_id = {}
    records.ledger = defaultdict(list)
    for number, moment in enumerate(sent):
        key = f"{EXECUTION}:step-{number}"
        line = LedgerLine(moment, "arrived", WRITES, key, 1, lookup, 1, moment)
        records.ledger[key].append(line)
    return records


def test_calls_at_the_rate_after_a_burst_keep_the_limit() -> None:
    burst, interval = WRITES_RATE_LIMIT.burst, 1 / WRITES_RATE_LIMIT.per_second
    sent = [100.0] * burst + [100.0 + interval * n for n in range(1, 50)]
    assert rate_limit_held(_records(*sent)) == []


def test_more_calls_than_the_bucket_allows_are_a_violation_with_the_calls_as_evidence() -> None:
    calls = WRITES_RATE_LIMIT.burst + int(WRITES_RATE_LIMIT.per_second * RATE_MARGIN_SECONDS) + 1
    spread = [100.0 + 0.001 * n for n in range(calls)]
    (violation,) = rate_limit_held(_records(50.0, *spread))
    assert violation.invariant == 8 and f"{calls} calls in 0.0" in violation.message
    assert len(violation.evidence) == calls
    # Look-ups are not calls of the route: they take no token.
    assert rate_limit_held(_records(*spread, lookup=True)) == []
