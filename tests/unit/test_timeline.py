"""The execution's history in words: every audit row and attempt, oldest first, said
plainly; a kind not worded yet still shows, by its name and its facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from orquestador.api.pages.timeline import timeline, took

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


def test_retries_rate_limit_waits_and_look_ups_say_what_the_engine_did() -> None:
    story = timeline(
        [
            _audit(
                "RETRY_SCHEDULED", 1, "w", actionId="charge", attempt=1, errorCode="TIMEOUT",
                delaySeconds=0.25,
            ),
            _audit(
                "RETRY_SCHEDULED", 2, "w", actionId="charge", attempt=2, errorCode="TIMEOUT",
                delaySeconds=125.4,
            ),
            _audit(
                "RATE_LIMITED", 3, "w", actionId="charge", capability="test.charge",
                dueAt="2026-03-01T10:30:05.5+01:00",
            ),
            _audit("RECONCILED_BY_LOOKUP", 4, "w", actionId="charge", attempt=2, externalKey="k"),
        ],
        [],
    )  # fmt: skip

    assert [m.words for m in story] == [
        "Step charge will be tried again in 250 ms (TIMEOUT on attempt 1).",
        "Step charge will be tried again in 2 min 5 s (TIMEOUT on attempt 2).",
        "Step charge waited for its route's rate limit; no attempt spent.",
        "A look-up found that step charge's attempt 2 had taken effect: it was not sent again.",
    ]
    assert story[2].facts == (("Due again", "2026-03-01 09:30:05 UTC"),)
    assert [m.facts for m in (story[0], story[1], story[3])] == [(), (), ()]


def test_notices_say_what_became_of_their_e_mail() -> None:
    story = timeline(
        [
            _audit("NOTICE_WRITTEN", 1, "w", noticeId="n-1", email="queued", test=False),
            _audit("NOTICE_WRITTEN", 2, "w", noticeId="n-2", email="no_recipients", test=False),
            _audit("NOTICE_WRITTEN", 3, "w", noticeId="n-3", email="org_opted_out", test=False),
            _audit("NOTICE_EMAIL_SETTLED", 4, None, noticeId="n-1", email="delivered"),
            _audit("NOTICE_EMAIL_SETTLED", 5, None, noticeId="n-1", email="failed"),
        ],
        [],
    )

    assert [m.words for m in story] == [
        "A notice was written; an e-mail is queued.",
        "A notice was written; no e-mail (the organization names nobody to send it to).",
        "A notice was written; no e-mail (the organization opted out).",
        "A notice's e-mail was delivered.",
        "A notice's e-mail could not be delivered.",
    ]
    assert all(m.facts == () for m in story)


def test_an_error_exit_and_a_failure_name_the_step_the_code_and_where_the_request_went() -> None:
    story = timeline(
        [
            _audit(
                "STEP_ERROR_EXIT", 1, "w", actionId="wait", errorCode="WAIT_DEADLINE_EXCEEDED",
                fromState="new", toState="attention", message="no answer in 60 s",
                observed={"wait": {"status": "sent"}}, transitionId="power-off", revision=3,
            ),
            _audit("EXECUTION_FAILED", 2, "w", errorCode="INPUT_INVALID"),
        ],
        [],
    )  # fmt: skip

    assert [m.words for m in story] == [
        "Step wait failed (WAIT_DEADLINE_EXCEEDED); its error exit moved the request"
        " new → attention.",
        "Failed (INPUT_INVALID).",
    ]
    assert story[0].facts == (("Message", "no answer in 60 s"),)  # not the frozen evidence


def test_a_cancel_after_a_write_says_it_parked_and_what_it_did_on_machines() -> None:
    commands = {
        "cancelled": [{"command": "reboot", "machineId": "m-1"}],
        "stopRequested": [{"command": "poweroff", "machineId": "m-1"}],
    }
    story = timeline(
        [
            _audit(
                "RECONCILIATION_REQUIRED", 1, "alice", reason="CANCELLED_AFTER_WRITES",
                cancelReason="customer asked on the phone", machineCommands=commands,
                checkpoints=[{"actionId": "send"}], writesSucceeded=["send"],
            ),
            _audit("EXECUTION_CANCELLED", 2, "bob", reason="duplicate", machineCommands={}),
        ],
        [],
    )  # fmt: skip

    assert [m.words for m in story] == [
        "alice cancelled it after a write was done or in doubt: it waits for a person to say"
        " what happened. On machines, cancelled before any agent took them: reboot; agents"
        " asked to stop: poweroff.",
        "bob cancelled it.",
    ]
    assert story[0].facts == (("Reason", "customer asked on the phone"),)
    assert story[1].facts == (("Reason", "duplicate"),)


def test_an_approval_decided_or_left_past_its_deadline() -> None:
    story = timeline(
        [
            _audit("APPROVAL_DECIDED", 1, "bob", decision="rejected", comment="not tonight"),
            _audit("APPROVAL_EXPIRED", 2, "w", deadlineAt="2026-03-01T10:30:00+01:00"),
        ],
        [],
    )

    assert [m.words for m in story] == [
        "bob rejected the approval.",
        "Nobody decided the approval before its deadline.",
    ]
    assert story[0].facts == (("Comment", "not tonight"),)
    assert story[1].facts == (("Deadline", "2026-03-01 09:30:00 UTC"),)


def test_a_confirm_shows_its_output_beside_the_reason() -> None:
    (moment,) = timeline(
        [
            _audit(
                "RECONCILIATION_RESOLVED", 1, "bob", decision="confirm", actionId="charge",
                reason="the dashboard shows it", output={"chargeId": "ch_1", "amount": 900},
            )
        ],
        [],
    )  # fmt: skip

    assert moment.words == "bob confirmed step charge."
    assert moment.facts == (
        ("Reason", "the dashboard shows it"),
        ("Output", '{"amount": 900, "chargeId": "ch_1"}'),
    )


def test_a_confirmed_output_is_left_out_for_who_may_not_see_outputs() -> None:
    (moment,) = timeline(
        [
            _audit(
                "RECONCILIATION_RESOLVED", 1, "bob", decision="confirm", actionId="charge",
                reason="the dashboard shows it", output={"chargeId": "ch_1"},
            )
        ],
        [],
        outputs=False,
    )  # fmt: skip

    assert moment.facts == (("Reason", "the dashboard shows it"),)


def test_the_acceptance_names_the_flow_version_and_what_asked_when_no_person_did() -> None:
    accepted = {"transitionId": "run", "fromState": "new", "acceptedRevision": 2}
    story = timeline(
        [
            _audit("TRANSITION_ACCEPTED", 0, "alice", **accepted),
            _audit(
                "TRANSITION_ACCEPTED", 1, "alice", **accepted,
                startedBy={"schedule": "nightly", "fireTime": "2026-03-01T03:00:00+01:00"},
            ),
            _audit(
                "TRANSITION_ACCEPTED", 2, "panel", **accepted,
                startedBy={"event": "e-1", "moment": "provisioned", "plan": "vps"},
            ),
        ],
        [],
        flow="tick v3",
    )  # fmt: skip

    assert [m.words for m in story] == [
        "alice asked for run from new at revision 2 (flow tick v3).",
        "Schedule nightly's fire asked for run from new at revision 2 (flow tick v3).",
        "Platform event provisioned of plan vps asked for run from new at revision 2"
        " (flow tick v3).",
    ]
    # Whom a fire or an event acts for stays the row's actor.
    assert [m.actor for m in story] == ["alice", "alice", "panel"]


def test_a_step_s_first_attempt_runs_from_the_step_s_first_start_not_its_last_round() -> None:
    # A wait that began at T0 and failed on its last round, 19 ms long, 9 s later.
    last_round = _attempt(1, 9, 19, status="FAILED", error_code="WAIT_TIMEOUT")
    retried = _attempt(2, 30, 40, status="FAILED")
    steps = [{"actionId": "charge", "startedAt": T0.isoformat()}]

    first, second = timeline([], [last_round, retried], steps)

    assert first.words == "Step charge, attempt 1, failed after 9 s (WAIT_TIMEOUT)."
    assert first.at == T0
    # A later attempt is its own: it began when it began.
    assert second.words == "Step charge, attempt 2, failed after 40 ms."
