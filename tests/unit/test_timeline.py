"""The execution's history in words: every audit row and attempt, oldest first, said
plainly; a kind not worded yet still shows, by its name and its facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from orquestador.api.timeline import timeline, took

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def _audit(kind: str, seconds: int, actor: str | None = None, **detail: object) -> SimpleNamespace:
    return SimpleNamespace(
        kind=kind, actor=actor, detail=detail, created_at=T0 + timedelta(seconds=seconds)
    )


def _attempt(n: int, seconds: int, took_ms: int | None, **more: object) -> SimpleNamespace:
    started = T0 + timedelta(seconds=seconds)
    finished = None if took_ms is None else started + timedelta(milliseconds=took_ms)
    values = {"status": "SUCCEEDED", "error_code": None, "message": None, **more}
    return SimpleNamespace(
        action_id="charge", attempt=n, started_at=started, finished_at=finished, **values
    )


def test_the_story_is_told_in_order_with_durations_actors_and_corrections() -> None:
    audit = [
        _audit(
            "TRANSITION_ACCEPTED",
            0,
            "alice",
            transitionId="pay",
            fromState="new",
            acceptedRevision=2,
        ),
        _audit("RECONCILIATION_REQUIRED", 2, "worker", reason="UNCERTAIN_OUTCOME"),
        _audit(
            "RECONCILIATION_RESOLVED",
            60,
            "bob",
            decision="retry",
            actionId="charge",
            reason="customer confirmed 950",
            correction=[
                {"path": "/amount", "before": 900, "after": 950},
                {"path": "/note", "after": "by phone"},
            ],
        ),
        _audit(
            "TRANSITION_COMPLETED", 62, "worker", fromState="new", toState="paid", ruleIds=["ok"]
        ),
    ]
    attempts = [
        _attempt(1, 1, 14, status="UNKNOWN", error_code="UNCERTAIN", message="reset"),
        _attempt(2, 61, 1500),
    ]

    story = timeline(audit, attempts)

    assert [m.words for m in story] == [
        "alice asked for pay from new at revision 2.",
        "Step charge, attempt 1, ended without a known outcome after 14 ms (UNCERTAIN).",
        "Parked for a person to decide (UNCERTAIN_OUTCOME).",
        "bob asked for a retry of step charge with a correction of the request data.",
        "Step charge, attempt 2, succeeded after 2 s.",
        "Completed: new → paid (rule ok).",
    ]
    assert story[1].facts == (("Message", "reset"),)
    assert story[3].facts == (
        ("Reason", "customer confirmed 950"),
        ("Corrected /amount", "900 → 950"),
        ("Corrected /note", "(absent) → by phone"),
    )


def test_an_unknown_kind_shows_its_name_and_facts_but_not_the_bulky_evidence() -> None:
    (moment,) = timeline([_audit("SOMETHING_NEW", 0, "x", answer=42, checkpoints=[1])], [])

    assert moment.words == "Something new."
    assert moment.facts == (("answer", "42"),)


def test_an_interrupted_attempt_says_so_and_durations_read_as_people_say_them() -> None:
    (moment,) = timeline([], [_attempt(1, 0, None)])

    assert moment.words == "Step charge, attempt 1, was interrupted."
    assert took(T0, T0 + timedelta(milliseconds=250)) == "250 ms"
    assert took(T0, T0 + timedelta(seconds=125)) == "2 min 5 s"
    assert took(T0, None) == "no end recorded"
