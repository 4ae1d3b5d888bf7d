"""approval@1: a person's decision as a durable wait, through the API and a real worker step.

The flow asks `approvers` and goes on with the decision; the API lists an approver's own
approvals and takes one decision; the deadline fails the step through its error exit.
A decision and the deadline, or two decisions, racing on one approval: exactly one wins.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.approvals.store import close_at_deadline
from orquestador.queue.reconciliation import cancel_in_transaction
from orquestador.worker.executor import Executor
from tests.integration.api_support import ORG, OTHER_ORG, Api, problem
from tests.integration.approval_support import (  # the fixtures api, executor, registry
    approval_flow,
    builtins_api,  # noqa: F401
    builtins_executor,  # noqa: F401
    builtins_registry,  # noqa: F401
)
from tests.integration.worker_support import (
    audit,
    claim_one,
    execution,
    make_due,
    request_row,
    run_once,
    wait_until,
    waiting_on_locks,
)

DECIDE = ["approvals:decide"]
REQUESTER = ["flows:admin", "requests:read", "requests:write"]


def start(api: Api, flow: dict[str, Any] | None = None, org: str = ORG) -> uuid.UUID:
    """Alice asks for the transition; the execution's id."""
    published = api.publish(flow or approval_flow(), org=org)
    created = api.create_request(published["id"], {"machineId": "m-1"}, org=org)
    response = api.transition(created["id"], "ask", created["revision"], org=org)
    assert response.status_code == 202, response.get_data(as_text=True)
    return uuid.UUID(response.get_json()["executionId"])


def open_approvals(api: Api, sub: str, scopes: list[str] = DECIDE) -> list[dict[str, Any]]:
    response = api.get("/approvals?status=open", sub=sub, scopes=scopes)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["items"]


def decide(api: Api, approval_id: str, sub: str, decision: str, **more: Any) -> Any:
    body = {"decision": decision, **more}
    return api.post(f"/approvals/{approval_id}/decision", body, sub=sub, scopes=DECIDE)


def waiting(engine: Engine, executor: Executor, execution_id: uuid.UUID) -> None:
    assert run_once(engine, executor) == "WAITING"
    row = execution(engine, execution_id)
    assert row.lease_owner is None and row.wait_key.startswith("approval:")


def test_the_step_waits_for_an_approver_and_goes_on_with_the_decision(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    assert (item["executionId"], item["title"], item["open"]) == (
        str(execution_id),
        "Reboot m-1?",
        True,
    )
    assert open_approvals(api, "carol") == []  # not an approver: not even listed

    response = decide(api, item["id"], "bob", "approved", comment="go ahead")
    assert response.status_code == 200, response.get_data(as_text=True)
    decided = response.get_json()
    assert (decided["status"], decided["decidedBy"], decided["comment"]) == (
        "approved",
        "bob",
        "go ahead",
    )
    # The decision woke the execution: due now, not at the deadline.
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    row = execution(runtime_engine, execution_id)
    request = request_row(runtime_engine, row.request_id)
    assert (request.state, request.data["decidedBy"]) == ("rebooting", "bob")
    (audited,) = audit(runtime_engine, execution_id, "APPROVAL_DECIDED")
    assert audited.actor == "bob"
    assert audited.detail == {
        "approvalId": item["id"],
        "decision": "approved",
        "comment": "go ahead",
    }

    again = decide(api, item["id"], "bob", "rejected")
    assert again.status_code == 409 and problem(again)["code"] == "APPROVAL_CLOSED"
    assert open_approvals(api, "bob") == []


def test_a_rejection_is_an_answer_the_flow_routes(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    assert decide(api, item["id"], "bob", "rejected").status_code == 200
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).state == "refused"


def test_the_requester_never_decides_their_own_request(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api, approval_flow({"subjects": ["alice", "bob"]}))
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "alice")
    refused = decide(api, item["id"], "alice", "approved")
    assert refused.status_code == 403 and problem(refused)["code"] == "SELF_APPROVAL"
    assert open_approvals(api, "bob")[0]["status"] == "open"
    assert audit(runtime_engine, execution_id, "APPROVAL_DECIDED") == []


def test_a_scope_names_approvers_and_anyone_else_finds_nothing(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api, approval_flow({"scope": "ops:lead"}))
    waiting(runtime_engine, executor, execution_id)
    assert open_approvals(api, "carol") == []
    (item,) = open_approvals(api, "dave", [*DECIDE, "ops:lead"])
    assert api.get(f"/approvals/{item['id']}", sub="carol", scopes=DECIDE).status_code == 404
    refused = decide(api, item["id"], "carol", "approved")
    assert refused.status_code == 404
    # Another organization's approver with the same scope sees nothing either.
    foreign = api.get(
        f"/approvals/{item['id']}", sub="dave", org=OTHER_ORG, scopes=[*DECIDE, "ops:lead"]
    )
    assert foreign.status_code == 404
    no_scope = api.get("/approvals", sub="dave", scopes=["ops:lead"])
    assert no_scope.status_code == 403 and problem(no_scope)["code"] == "INSUFFICIENT_SCOPE"
    body = {"decision": "approved"}
    accepted = api.post(
        f"/approvals/{item['id']}/decision", body, sub="dave", scopes=[*DECIDE, "ops:lead"]
    )
    assert accepted.status_code == 200


@pytest.mark.parametrize(
    ("decider", "scopes"),
    [("bob", DECIDE), ("dave", [*DECIDE, "ops:lead"])],
    ids=["a-listed-subject", "a-holder-of-the-scope"],
)
def test_with_subjects_and_a_scope_either_one_qualifies(
    api: Api, executor: Executor, runtime_engine: Engine, decider: str, scopes: list[str]
) -> None:
    execution_id = start(api, approval_flow({"subjects": ["bob"], "scope": "ops:lead"}))
    waiting(runtime_engine, executor, execution_id)
    # Each finds it: bob by name without the scope, dave by the scope without the name.
    (item,) = open_approvals(api, "bob")
    assert [a["id"] for a in open_approvals(api, "dave", [*DECIDE, "ops:lead"])] == [item["id"]]
    # Neither named nor holding the scope: nothing listed, nothing to decide.
    assert open_approvals(api, "carol") == []
    assert decide(api, item["id"], "carol", "approved").status_code == 404

    body = {"decision": "approved"}
    decided = api.post(f"/approvals/{item['id']}/decision", body, sub=decider, scopes=scopes)
    assert decided.status_code == 200, decided.get_data(as_text=True)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).data["decidedBy"] == decider


@pytest.mark.parametrize(
    ("body", "where"),
    [({"decision": "maybe"}, "/decision"), ({"decision": "approved", "why": "x"}, "/why")],
)
def test_a_bad_decision_body_is_refused_and_decides_nothing(
    api: Api, executor: Executor, runtime_engine: Engine, body: dict[str, Any], where: str
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    response = api.post(f"/approvals/{item['id']}/decision", body, sub="bob", scopes=DECIDE)
    assert response.status_code == 422
    assert [p["path"] for p in problem(response)["problems"]] == [where]
    assert open_approvals(api, "bob")[0]["status"] == "open"


def _past_deadline(engine: Engine, approval_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE approval SET deadline_at = now() - interval '1 s' WHERE id = :id"),
            {"id": approval_id},
        )


def test_the_deadline_fails_the_step_through_its_error_exit(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    _past_deadline(owner_engine, item["id"])
    assert decide(api, item["id"], "bob", "approved").status_code == 409
    make_due(runtime_engine, execution_id)
    run_once(runtime_engine, executor)
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).state == "timed-out"
    (exit_row,) = audit(runtime_engine, execution_id, "STEP_ERROR_EXIT")
    assert exit_row.detail["errorCode"] == "APPROVAL_DEADLINE_EXCEEDED"
    assert len(audit(runtime_engine, execution_id, "APPROVAL_EXPIRED")) == 1
    closed = api.get(f"/approvals/{item['id']}", sub="bob", scopes=DECIDE).get_json()
    assert (closed["status"], closed["open"]) == ("expired", False)


def test_a_decision_stands_once_the_deadline_passes(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    assert decide(api, item["id"], "bob", "approved").status_code == 200
    _past_deadline(owner_engine, item["id"])  # the round that reads it comes late
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert audit(runtime_engine, execution_id, "APPROVAL_EXPIRED") == []


def test_an_approval_whose_execution_was_cancelled_is_not_decided(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    cancelled = api.post(f"/executions/{execution_id}/cancel", {"reason": "not needed"})
    assert cancelled.status_code == 200 and cancelled.get_json()["status"] == "CANCELLED"
    refused = decide(api, item["id"], "bob", "approved")
    assert refused.status_code == 409 and problem(refused)["code"] == "APPROVAL_CLOSED"
    assert open_approvals(api, "bob") == []
    closed = api.get("/approvals?status=closed", sub="bob", scopes=DECIDE).get_json()["items"]
    assert [(a["id"], a["status"], a["open"]) for a in closed] == [(item["id"], "open", False)]


def test_an_approval_whose_execution_has_a_cancel_requested_is_not_decided(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    with runtime_engine.begin() as conn:  # a wait's round is checking it again
        conn.execute(
            text("UPDATE execution SET next_attempt_at = now() WHERE id = :id"),
            {"id": execution_id},
        )
    claim_one(runtime_engine, "w9")
    requested = api.post(f"/executions/{execution_id}/cancel", {"reason": "not needed"})
    assert requested.status_code == 200 and requested.get_json()["cancelRequested"] is True

    refused = decide(api, item["id"], "bob", "approved")
    assert refused.status_code == 409 and problem(refused)["code"] == "APPROVAL_CLOSED"
    assert "a cancel of its execution was requested" in problem(refused)["detail"]


def test_a_decision_racing_an_uncommitted_cancel_waits_for_it_and_is_refused_in_words(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    """The cancel holds the execution (not yet committed) when bob approves: the decision
    waits for it, reads the execution cancelled, and answers 409 in words; nothing is
    approved or audited."""
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    answers: dict[str, Any] = {}

    def decision() -> None:
        answers["decision"] = decide(api, item["id"], "bob", "approved")

    racer = threading.Thread(target=decision)
    with runtime_engine.connect() as canceller, owner_engine.connect() as watcher:
        canceller.begin()
        cancelled = cancel_in_transaction(canceller, execution_id, ORG, "carol", "not needed")
        assert cancelled.status == "CANCELLED"
        racer.start()
        wait_until(
            lambda: "decision" in answers or waiting_on_locks(watcher) == 1,
            what="the decision to wait for the cancel",
        )
        assert "decision" not in answers, "decided while the cancel held the execution"
        canceller.commit()
    racer.join(30)

    refused = answers["decision"]
    assert refused.status_code == 409, refused.get_data(as_text=True)
    assert problem(refused)["code"] == "APPROVAL_CLOSED"
    assert problem(refused)["detail"] == (
        "The approval can no longer be decided: its execution was cancelled."
    )
    assert audit(runtime_engine, execution_id, "APPROVAL_DECIDED") == []
    closed = api.get("/approvals?status=closed", sub="bob", scopes=DECIDE).get_json()["items"]
    assert [(a["id"], a["status"]) for a in closed] == [(item["id"], "open")]


def test_a_decision_racing_a_park_that_holds_only_the_execution_waits_and_is_refused(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    """The worker's writes lock the execution row alone: a decision racing a park that
    has not committed yet waits for that row and reads the execution parked."""
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    answers: dict[str, Any] = {}

    def decision() -> None:
        answers["decision"] = decide(api, item["id"], "bob", "approved")

    racer = threading.Thread(target=decision)
    with owner_engine.connect() as parking, owner_engine.connect() as watcher:
        parking.begin()
        parking.execute(
            text(
                "UPDATE execution SET status = 'RECONCILIATION_REQUIRED',"
                " error_code = 'UNCERTAIN_OUTCOME', wait_key = NULL WHERE id = :id"
            ),
            {"id": execution_id},
        )
        racer.start()
        wait_until(
            lambda: "decision" in answers or waiting_on_locks(watcher) == 1,
            what="the decision to wait for the park",
        )
        assert "decision" not in answers, "decided while the park held the execution"
        parking.commit()
    racer.join(30)

    refused = answers["decision"]
    assert refused.status_code == 409, refused.get_data(as_text=True)
    assert problem(refused)["detail"] == (
        "The approval can no longer be decided: its execution waits for an operator's decision."
    )
    assert audit(runtime_engine, execution_id, "APPROVAL_DECIDED") == []


def test_a_decision_after_the_deadline_says_so(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    _past_deadline(owner_engine, item["id"])
    refused = decide(api, item["id"], "bob", "approved")
    assert refused.status_code == 409
    assert problem(refused)["detail"].startswith("The approval's deadline passed (")
    assert problem(refused)["detail"].endswith("nobody can decide it any more.")


# --- races: held at the approval's row lock, then let go at once ---------------------


def _race(owner_engine: Engine, approval_id: str, hold_sql: str, *racers: Any) -> None:
    """Hold the approval's row (running `hold_sql` on it), queue each racer on the lock in
    turn, then let go: they take the row in that order."""
    threads = []
    with owner_engine.connect() as holder, owner_engine.connect() as watcher:
        holder.begin()
        holder.execute(text(hold_sql), {"id": approval_id})
        for number, racer in enumerate(racers, 1):
            thread = threading.Thread(target=racer)
            thread.start()
            threads.append(thread)
            wait_until(lambda n=number: waiting_on_locks(watcher) == n, what=f"racer {number}")
        holder.commit()
    for thread in threads:
        thread.join(30)


@pytest.mark.parametrize("first", ["decision", "deadline"])
@pytest.mark.parametrize("passes", [True, False], ids=["deadline-passes", "deadline-ahead"])
def test_a_decision_and_the_deadline_racing_one_wins(
    api: Api,
    executor: Executor,
    runtime_engine: Engine,
    owner_engine: Engine,
    first: str,
    passes: bool,
) -> None:
    """The API's decision and the step's closing at the deadline (what its round runs once
    it read the deadline as passed) queue on the row; the deadline moves meanwhile."""
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    # The step read the deadline as passed: it closes the approval unless the row says
    # otherwise by the time it holds it.
    _past_deadline(owner_engine, item["id"])
    answers: dict[str, Any] = {}

    def decision() -> None:
        answers["decision"] = decide(api, item["id"], "bob", "approved")

    def deadline() -> None:
        with runtime_engine.begin() as conn:
            answers["deadline"] = close_at_deadline(conn, uuid.UUID(item["id"]), "worker")

    racers = (decision, deadline) if first == "decision" else (deadline, decision)
    moment = "clock_timestamp()" if passes else "clock_timestamp() + interval '1 hour'"
    hold = f"UPDATE approval SET deadline_at = {moment} WHERE id = :id"
    _race(owner_engine, item["id"], hold, *racers)

    # Exactly one closed the approval, and the step goes on by what that one left.
    won = "deadline" if passes else "decision"
    assert answers["decision"].status_code == (409 if passes else 200)
    # With the deadline moved ahead the step closes nothing: it reads the decision, or,
    # reading before the decision commits, finds it open and waits on.
    ahead = {"approved"} if first == "decision" else {"open", "approved"}
    assert answers["deadline"].status in ({"expired"} if passes else ahead)
    make_due(runtime_engine, execution_id)
    run_once(runtime_engine, executor)
    row = execution(runtime_engine, execution_id)
    state = request_row(runtime_engine, row.request_id).state
    assert state == ("timed-out" if won == "deadline" else "rebooting")
    assert len(audit(runtime_engine, execution_id, "APPROVAL_DECIDED")) == (won == "decision")
    assert len(audit(runtime_engine, execution_id, "APPROVAL_EXPIRED")) == (won == "deadline")


def test_the_deadline_never_closes_an_approval_a_decision_holds(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    """A decision taken a moment before the deadline commits a moment after it; the step,
    reading the deadline as passed meanwhile, waits for the row and finds it decided."""
    execution_id = start(api)
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    _past_deadline(owner_engine, item["id"])
    closed: list[Any] = []

    def deadline() -> None:
        with runtime_engine.begin() as conn:
            closed.append(close_at_deadline(conn, uuid.UUID(item["id"]), "worker"))

    decision = (
        "UPDATE approval SET status = 'approved', decided_by = 'bob',"
        " decided_at = clock_timestamp() WHERE id = :id"
    )
    _race(owner_engine, item["id"], decision, deadline)
    assert [row.status for row in closed] == ["approved"]
    make_due(runtime_engine, execution_id)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert audit(runtime_engine, execution_id, "APPROVAL_EXPIRED") == []


def test_two_approvers_deciding_at_once_make_one_decision(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    execution_id = start(api, approval_flow({"subjects": ["bob", "dave"]}))
    waiting(runtime_engine, executor, execution_id)
    (item,) = open_approvals(api, "bob")
    answers: dict[str, Any] = {}

    def by(sub: str, decision: str) -> Any:
        return lambda: answers.__setitem__(sub, decide(api, item["id"], sub, decision))

    hold = "SELECT id FROM approval WHERE id = :id FOR UPDATE"
    _race(owner_engine, item["id"], hold, by("bob", "approved"), by("dave", "rejected"))

    assert (answers["bob"].status_code, answers["dave"].status_code) == (200, 409)
    assert run_once(runtime_engine, executor) == "SUCCEEDED"
    row = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, row.request_id).state == "rebooting"
    (decided,) = audit(runtime_engine, execution_id, "APPROVAL_DECIDED")
    assert decided.actor == "bob"


# --- e-mail ------------------------------------------------------------------------------


def _outbox(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT subject, recipients, body FROM email_outbox")))


def _set_preferences(api: Api, opt_out: list[str]) -> None:
    preferences = {"optOut": opt_out, "recipients": ["ops@example.com"]}
    saved = api.client().put(
        f"/api/v1/orgs/{ORG}/notification-preferences",
        json=preferences,
        headers=api.headers(scopes=["org:admin"]),
    )
    assert saved.status_code == 200, saved.get_data(as_text=True)


def test_approvers_are_mailed_only_when_the_node_ticks_it(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    _set_preferences(api, opt_out=[])
    quiet = start(api)
    waiting(runtime_engine, executor, quiet)
    assert _outbox(runtime_engine) == []

    mailed = start(api, approval_flow(email=True) | {"key": "reboot-mailed"})
    waiting(runtime_engine, executor, mailed)
    (mail,) = _outbox(runtime_engine)
    assert mail.subject == "Approval needed: Reboot m-1?"
    assert mail.recipients == ["ops@example.com"]
    assert "Approvers: bob" in mail.body and "approvals decide" in mail.body
    # Another round finds the approval it wrote: no second e-mail.
    make_due(runtime_engine, mailed)
    assert run_once(runtime_engine, executor) == "WAITING"
    assert len(_outbox(runtime_engine)) == 1


def test_an_organization_that_opted_out_gets_the_notice_and_no_email(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    # Recipients are configured: the opt-out alone keeps the e-mail back.
    _set_preferences(api, opt_out=["automation"])
    execution_id = start(api, approval_flow(email=True))
    waiting(runtime_engine, executor, execution_id)
    assert _outbox(runtime_engine) == []

    listed = api.get("/notices", scopes=["notices:read"])
    assert listed.status_code == 200, listed.get_data(as_text=True)
    (notice,) = listed.get_json()["items"]
    assert (notice["title"], notice["email"], notice["test"], notice["executionId"]) == (
        "Approval needed: Reboot m-1?",
        "org_opted_out",
        False,
        str(execution_id),
    )
    (written,) = audit(runtime_engine, execution_id, "NOTICE_WRITTEN")
    assert written.detail == {"noticeId": notice["id"], "email": "org_opted_out", "test": False}
    # The approval itself is asked all the same.
    assert [a["executionId"] for a in open_approvals(api, "bob")] == [str(execution_id)]


def test_publishing_refuses_an_email_input_on_an_approval(api: Api) -> None:
    flow = approval_flow()
    flow["transitions"][0]["actions"][0]["input"]["email"] = {"const": True}
    response = api.post("/flows", flow)
    assert response.status_code == 422
    paths = [p["path"] for p in problem(response)["problems"]]
    assert paths == ["/transitions/0/actions/0/input/email"]


def test_an_approval_says_what_it_approves_in_the_api_its_page_and_its_email(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    _set_preferences(api, opt_out=[])
    flow = approval_flow(email=True)
    flow["dataSchema"]["properties"]["reason"] = {"type": "string"}
    flow["transitions"][0]["actions"][0]["input"]["title"] = {
        "format": "Reboot {/data/machineId}: {/data/reason}"
    }
    published = api.publish(flow)
    data = {"machineId": "m-1", "reason": "<b>kernel</b>\nupdate"}
    created = api.create_request(published["id"], data)
    accepted = api.transition(created["id"], "ask", created["revision"])
    execution_id = uuid.UUID(accepted.get_json()["executionId"])
    waiting(runtime_engine, executor, execution_id)

    (item,) = open_approvals(api, "bob")
    (mail,) = _outbox(runtime_engine)
    client = api.client()
    client.post(
        "/ui/login",
        data={"token": api.token(sub="bob", scopes=["requests:read", *DECIDE])},
        headers={"Origin": "http://localhost"},
    )
    page = client.get("/ui/approvals").get_data(as_text=True)

    # The title, formatted from the request data on one line.
    assert item["title"] == "Reboot m-1: <b>kernel</b> update"
    assert {k: item[k] for k in ("flowKey", "flowVersion", "transitionId", "machineId")} == {
        "flowKey": "reboot",
        "flowVersion": 1,
        "transitionId": "ask",
        "machineId": "m-1",
    }
    assert item["requestedBy"] == "alice"
    assert mail.subject == "Approval needed: Reboot m-1: <b>kernel</b> update"
    for line in ("Flow: reboot v1, transition ask", "Machine: m-1", "Asked by: alice"):
        assert line in mail.body.splitlines()
    # On the page the request's data is text: escaped, never markup.
    assert "Reboot m-1: &lt;b&gt;kernel&lt;/b&gt; update" in page
    assert "<b>kernel</b>" not in page
    assert "reboot v1, transition ask" in page and ">m-1</a>" in page


def test_a_format_the_request_data_cannot_fill_fails_the_mapping_with_its_pointer(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    flow = approval_flow()
    flow["transitions"][0]["actions"][0]["input"]["title"] = {
        "format": "Reboot {/data/machineId}: {/data/reason}"
    }
    execution_id = start(api, flow)

    assert run_once(runtime_engine, executor) == "FAILED"

    row = execution(runtime_engine, execution_id)
    assert (row.error_code, row.error_detail["pointer"]) == ("MAPPING_FAILED", "/data/reason")
