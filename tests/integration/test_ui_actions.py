"""Actions from the pages: each a POST form with the session's CSRF token and the origin
check, shown only to holders of the scope, done with the person as the audited actor.

Cancel, approve or reject, and dismiss a notice; a cross-site POST, a POST without the
token and one with another session's token are refused and change nothing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from orquestador.worker.executor import Executor
from tests.integration.api_support import ORG, OTHER_ORG, Api
from tests.integration.approval_support import (  # the fixtures api, executor, registry
    approval_flow,
    builtins_api,  # noqa: F401
    builtins_executor,  # noqa: F401
    builtins_registry,  # noqa: F401
)
from tests.integration.execution_page_support import HOST, signed_in, text_of, waiting
from tests.integration.worker_support import audit, execution, request_row, run_once

OPERATOR = ["requests:read", "executions:cancel", "notices:read"]
READER = ["requests:read"]
APPROVER = ["requests:read", "approvals:decide"]


def csrf_of(client: FlaskClient, page: str) -> str:
    html = client.get(page).get_data(as_text=True)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, f"no CSRF field on {page}"
    return found.group(1)


def cancel_page(execution_id: str) -> str:
    return f"/ui/executions/{execution_id}/cancel"


def post_cancel(client: FlaskClient, execution_id: str, **form: str) -> tuple[int, str]:
    headers = {"Origin": form.pop("origin", HOST)}
    response = client.post(cancel_page(execution_id), data=form, headers=headers)
    return response.status_code, response.get_data(as_text=True)


@pytest.fixture(name="waiting_one")
def waiting_execution(api: Api, owner_engine: Engine) -> Iterator[str]:
    yield waiting(api, owner_engine).execution_id


def test_an_operator_cancels_from_the_page_and_the_timeline_says_who_and_why(
    api: Api, waiting_one: str, runtime_engine: Engine
) -> None:
    client = signed_in(api, scopes=OPERATOR)
    page = client.get(f"/ui/executions/{waiting_one}")
    assert page.headers["Refresh"] == "5"  # not final: the page follows it
    assert cancel_page(waiting_one) in page.get_data(as_text=True)

    token = csrf_of(client, cancel_page(waiting_one))
    response = client.post(
        cancel_page(waiting_one),
        data={"csrf": token, "reason": "customer asked on the phone"},
        headers={"Origin": HOST},
    )

    assert response.status_code == 303
    assert response.headers["Location"] == f"/ui/executions/{waiting_one}?done=cancelled"
    (cancelled,) = audit(runtime_engine, uuid.UUID(waiting_one), "EXECUTION_CANCELLED")
    assert cancelled.actor == "alice"
    assert cancelled.detail["reason"] == "customer asked on the phone"
    # No write had happened: the request is free again, in the state and data it had.
    request = request_row(
        runtime_engine, execution(runtime_engine, uuid.UUID(waiting_one)).request_id
    )
    assert (request.state, request.busy_execution_id, request.data) == (
        "new",
        None,
        {"machineId": "m-1"},
    )
    after = client.get(response.headers["Location"])
    words = text_of(after.get_data(as_text=True))
    assert "The cancel was applied as the write rule allows." in words
    assert "alice cancelled it." in words and "customer asked on the phone" in words
    assert "alice asked for power-off from new at revision 2 (flow decommission v1)." in words
    assert "agents asked to stop: poweroff" in words
    assert "Refresh" not in after.headers  # final: nothing left to follow


@pytest.mark.parametrize(
    ("form", "code"),
    [
        ({"csrf": ""}, "CSRF_TOKEN_INVALID"),
        ({"csrf": "0" * 64}, "CSRF_TOKEN_INVALID"),
        ({"origin": "https://evil.example"}, "CROSS_SITE_FORM"),
    ],
    ids=["no token", "wrong token", "cross-site"],
)
def test_a_forged_cancel_is_refused_and_changes_nothing(
    api: Api, waiting_one: str, runtime_engine: Engine, form: dict[str, str], code: str
) -> None:
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, cancel_page(waiting_one))
    data = {"csrf": token, "reason": "forged", **form}

    status, html = post_cancel(client, waiting_one, **data)

    assert status == 403, html
    assert {"CSRF_TOKEN_INVALID": "out of date", "CROSS_SITE_FORM": "page of this server"}[
        code
    ] in html
    assert execution(runtime_engine, uuid.UUID(waiting_one)).status == "WAITING"
    assert audit(runtime_engine, uuid.UUID(waiting_one), "EXECUTION_CANCELLED") == []


def test_another_sessions_token_does_not_carry_over(
    api: Api, waiting_one: str, runtime_engine: Engine
) -> None:
    mine = signed_in(api, scopes=OPERATOR)
    theirs = signed_in(api, sub="mallory", scopes=OPERATOR)
    stolen = csrf_of(theirs, cancel_page(waiting_one))

    status, _ = post_cancel(mine, waiting_one, csrf=stolen, reason="x")

    assert status == 403
    assert execution(runtime_engine, uuid.UUID(waiting_one)).status == "WAITING"


def test_without_the_scope_there_is_no_cancel_and_a_post_is_refused(
    api: Api, waiting_one: str, runtime_engine: Engine
) -> None:
    client = signed_in(api, scopes=READER)
    page = client.get(f"/ui/executions/{waiting_one}").get_data(as_text=True)
    assert cancel_page(waiting_one) not in page
    assert client.get(cancel_page(waiting_one)).status_code == 403
    # The token is the session's, whatever the scope: the scope is what refuses.
    token = csrf_of(client, f"/ui/executions/{waiting_one}")

    status, html = post_cancel(client, waiting_one, csrf=token, reason="x")

    assert status == 403 and "executions:cancel" in html
    assert execution(runtime_engine, uuid.UUID(waiting_one)).status == "WAITING"


def test_a_cancel_needs_a_reason_and_a_foreign_execution_is_not_found(
    api: Api, waiting_one: str, owner_engine: Engine
) -> None:
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, cancel_page(waiting_one))
    status, html = post_cancel(client, waiting_one, csrf=token, reason="  ")
    # The form again, the problem said beside the box, not an error page.
    assert status == 422 and 'id="cancel-reason-problem">Say why' in html
    assert 'name="reason"' in html

    foreign = waiting(api, owner_engine, org=OTHER_ORG).execution_id
    assert post_cancel(client, foreign, csrf=token, reason="x")[0] == 404
    assert post_cancel(client, "not-an-id", csrf=token, reason="x")[0] == 404


def test_a_signed_out_form_is_refused(api: Api, waiting_one: str) -> None:
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, cancel_page(waiting_one))
    client.post("/ui/logout", headers={"Origin": HOST})

    status, _ = post_cancel(client, waiting_one, csrf=token, reason="x")

    assert status == 401


# --- approvals -------------------------------------------------------------------------


def _approval(
    api: Api, executor: Executor, engine: Engine, approvers: list[str] | None = None
) -> tuple[str, str]:
    published = api.publish(approval_flow({"subjects": approvers or ["bob"]}))
    created = api.create_request(published["id"], {"machineId": "m-1"})
    response = api.transition(created["id"], "ask", created["revision"])
    execution_id = response.get_json()["executionId"]
    assert run_once(engine, executor) == "WAITING"
    listed = api.get("/approvals", sub="bob", scopes=["approvals:decide"]).get_json()["items"]
    (item,) = listed
    return item["id"], execution_id


def test_an_approver_approves_from_the_page_with_a_comment(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    approval_id, execution_id = _approval(api, executor, runtime_engine)
    client = signed_in(api, sub="bob", scopes=APPROVER)
    token = csrf_of(client, f"/ui/executions/{execution_id}")

    response = client.post(
        f"/ui/approvals/{approval_id}/decision",
        data={"csrf": token, "decision": "approved", "comment": "window agreed"},
        headers={"Origin": HOST},
    )

    assert response.status_code == 303
    assert response.headers["Location"] == f"/ui/executions/{execution_id}?done=approved"
    (decided,) = audit(runtime_engine, uuid.UUID(execution_id), "APPROVAL_DECIDED")
    assert (decided.actor, decided.detail["comment"]) == ("bob", "window agreed")


def test_the_requester_cannot_approve_from_the_page_either(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    approval_id, execution_id = _approval(api, executor, runtime_engine, ["alice", "bob"])
    client = signed_in(api, sub="alice", scopes=APPROVER)
    token = csrf_of(client, f"/ui/executions/{execution_id}")

    response = client.post(
        f"/ui/approvals/{approval_id}/decision",
        data={"csrf": token, "decision": "approved"},
        headers={"Origin": HOST},
    )

    assert response.status_code == 403
    assert "someone else decides" in response.get_data(as_text=True)
    assert audit(runtime_engine, uuid.UUID(execution_id), "APPROVAL_DECIDED") == []


# --- notices ---------------------------------------------------------------------------


def _notice(owner_engine: Engine, org: str = ORG) -> str:
    with owner_engine.begin() as conn:
        return str(
            conn.execute(
                text(
                    "INSERT INTO panel_notice (org_id, category, title, body, external_key)"
                    " VALUES (:org, 'machine', 'Disk almost full', 'm-1 at 95%', :key)"
                    " RETURNING id"
                ),
                {"org": org, "key": str(uuid.uuid4())},
            ).scalar_one()
        )


def test_a_notice_is_dismissed_in_one_click_and_the_dismisser_is_kept(
    api: Api, owner_engine: Engine
) -> None:
    notice_id = _notice(owner_engine)
    foreign_id = _notice(owner_engine, OTHER_ORG)
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, "/ui/executions")

    response = client.post(
        f"/ui/notices/{notice_id}/dismiss",
        data={"csrf": token, "next": "/ui/executions"},
        headers={"Origin": HOST},
    )
    foreign = client.post(
        f"/ui/notices/{foreign_id}/dismiss", data={"csrf": token}, headers={"Origin": HOST}
    )

    assert response.status_code == 303
    assert response.headers["Location"] == "/ui/executions?done=dismissed"
    assert foreign.status_code == 404
    with owner_engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id::text, dismissed_by FROM panel_notice")).all())
    assert rows == {notice_id: "alice", foreign_id: None}


def test_a_form_never_sends_a_person_to_another_site(api: Api, owner_engine: Engine) -> None:
    notice_id = _notice(owner_engine)
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, "/ui/executions")

    response = client.post(
        f"/ui/notices/{notice_id}/dismiss",
        data={"csrf": token, "next": "https://evil.example/"},
        headers={"Origin": HOST},
    )

    assert response.headers["Location"] == "/ui/executions?done=dismissed"


# --- dry runs --------------------------------------------------------------------------


def test_a_flow_author_starts_a_dry_run_from_the_page(api: Api, runtime_engine: Engine) -> None:
    flow_id = api.publish()["id"]
    client = signed_in(api, scopes=["requests:read", "flows:admin"])
    token = csrf_of(client, "/ui/executions")
    form = {"csrf": token, "transition": "power-off", "data": '{"machineId": "m-1"}'}

    response = client.post(f"/ui/flows/{flow_id}/dry-runs", data=form, headers={"Origin": HOST})
    bad = client.post(
        f"/ui/flows/{flow_id}/dry-runs", data={**form, "data": "{nope"}, headers={"Origin": HOST}
    )
    forged = client.post(
        f"/ui/flows/{flow_id}/dry-runs", data={**form, "csrf": ""}, headers={"Origin": HOST}
    )

    assert response.status_code == 303, response.get_data(as_text=True)
    location = response.headers["Location"]
    assert location.endswith("?done=dry-run")
    execution_id = location.split("/")[-1].split("?")[0]
    assert execution(runtime_engine, uuid.UUID(execution_id)).simulation is True
    assert "The dry run started" in text_of(client.get(location).get_data(as_text=True))
    # The flow page again, the JSON as typed and what is wrong beside it.
    html = bad.get_data(as_text=True)
    assert bad.status_code == 422
    assert 'id="dry-data-problem">This is not valid JSON' in html and ">{nope</textarea>" in html
    assert forged.status_code == 403
    refused = client.post(
        f"/ui/flows/{flow_id}/dry-runs",
        data={**form, "transition": "no-such-transition"},
        headers={"Origin": HOST},
    )
    assert refused.status_code in (409, 422)
    html = refused.get_data(as_text=True)
    assert "The dry run was not started." in text_of(html) and "Unprocessable" not in html
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM execution")).scalar_one() == 1


# --- bulk actions ----------------------------------------------------------------------


def test_a_bulk_cancel_from_the_pages_previews_asks_why_and_shows_progress(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    ids = [waiting(api, owner_engine).execution_id for _ in range(3)]
    client = signed_in(api, scopes=OPERATOR)

    preview = client.get("/ui/bulk?action=cancel&status=WAITING")
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200 and "3 executions match" in text_of(html)
    assert all(execution(runtime_engine, uuid.UUID(i)).status == "WAITING" for i in ids)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert token is not None
    form = {"csrf": token.group(1), "action": "cancel", "status": "WAITING", "reason": "outage"}

    forged = client.post("/ui/bulk", data={**form, "csrf": ""}, headers={"Origin": HOST})
    response = client.post("/ui/bulk", data=form, headers={"Origin": HOST})

    assert forged.status_code == 403
    assert response.status_code == 303
    page = client.get(response.headers["Location"])
    assert page.status_code == 200 and "Bulk cancel: 0 of 3 done" in text_of(
        page.get_data(as_text=True)
    )
    assert page.headers["Refresh"] == "2"  # the worker has not taken it yet
    with runtime_engine.connect() as conn:
        (actor, reason) = conn.execute(text("SELECT actor, reason FROM bulk_action")).one()
    assert (actor, reason) == ("alice", "outage")


def test_a_bulk_preview_refuses_a_bad_filter_and_a_reader(api: Api) -> None:
    operator = signed_in(api, scopes=OPERATOR)
    reader = signed_in(api, scopes=READER)

    bad = operator.get("/ui/bulk?action=cancel&createdAfter=yesterday")
    unknown = operator.get("/ui/bulk?action=retry&status=FAILED")

    assert bad.status_code == 422
    html = bad.get_data(as_text=True)
    # Said next to the field, the typed value kept, nothing previewed.
    assert 'id="bulk-after-problem">a date and time with its offset, such as' in html
    assert 'value="yesterday"' in html and 'aria-invalid="true"' in html
    assert "match" not in text_of(html).split("Nothing was done.")[-1]
    assert unknown.status_code == 422  # retry needs executions:reconcile, not held
    assert reader.get("/ui/bulk").status_code == 403


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("status=WAITING&flow=decommission", "flow is not a filter a bulk action takes"),
        ("flowkey=decommission", "flowkey is not a filter a bulk action takes"),
        ("status=WAITING&id=00000000", "a bulk action does not take an id"),
        ("status=WAITING&simulation=true", "dry runs are never taken by a bulk action"),
    ],
)
def test_a_bulk_preview_refuses_a_filter_it_does_not_take_instead_of_ignoring_it(
    api: Api, owner_engine: Engine, query: str, said: str
) -> None:
    waiting(api, owner_engine)
    operator = signed_in(api, scopes=OPERATOR)

    response = operator.get(f"/ui/bulk?action=cancel&{query}")

    html = response.get_data(as_text=True)
    assert response.status_code == 400
    assert "Nothing was previewed or done." in text_of(html) and said in text_of(html)
    assert "execution matches" not in text_of(html) and 'name="reason"' not in html


def test_a_bulk_form_with_a_field_it_does_not_take_does_nothing(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    ids = [waiting(api, owner_engine).execution_id for _ in range(2)]
    client = signed_in(api, scopes=OPERATOR)
    token = csrf_of(client, "/ui/bulk?action=cancel&status=WAITING")
    form = {"csrf": token, "action": "cancel", "status": "WAITING", "reason": "outage"}

    extra = client.post("/ui/bulk", data={**form, "flow": "other"}, headers={"Origin": HOST})
    blank = client.post("/ui/bulk", data={**form, "reason": "  "}, headers={"Origin": HOST})

    assert extra.status_code == 400
    assert "flow is not a filter a bulk action takes" in text_of(extra.get_data(as_text=True))
    # A reason left out: the preview again, what to write said beside the box.
    assert blank.status_code == 422
    html = blank.get_data(as_text=True)
    assert 'id="bulk-reason-problem">say why' in html and "2 executions match" in text_of(html)
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM bulk_action")).scalar_one() == 0
    assert all(execution(runtime_engine, uuid.UUID(i)).status == "WAITING" for i in ids)


def test_the_list_offers_a_bulk_action_on_exactly_what_it_finds(
    api: Api, owner_engine: Engine
) -> None:
    waiting(api, owner_engine)
    operator = signed_in(api, scopes=OPERATOR)

    found = operator.get("/ui/executions?status=WAITING&machineId=m-1").get_data(as_text=True)
    by_id = operator.get("/ui/executions?status=WAITING&id=00000000").get_data(as_text=True)
    reader = signed_in(api, scopes=READER).get("/ui/executions?status=WAITING")

    link = re.search(r'href="(/ui/bulk\?[^"]+)"', found)
    assert link is not None
    preview = operator.get(link.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert "1 execution matches" in text_of(preview)
    assert "/ui/bulk?" not in by_id  # an id search is not a filter a bulk action takes
    assert "/ui/bulk?" not in reader.get_data(as_text=True)


def test_a_search_by_flow_key_offers_a_bulk_action_on_every_version_of_it(
    api: Api, owner_engine: Engine
) -> None:
    waiting(api, owner_engine)
    waiting(api, owner_engine)  # published again: version 2 of the same key
    operator = signed_in(api, scopes=OPERATOR)

    found = operator.get("/ui/executions?flowKey=decommission").get_data(as_text=True)

    link = re.search(r'href="(/ui/bulk\?[^"]+)"', found)
    assert link is not None and "flowKey=decommission" in link.group(1)
    preview = operator.get(link.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert "2 executions match" in text_of(preview)
    assert 'name="flowKey" type="text" value="decommission"' in preview


def test_open_notices_and_approvals_carry_their_one_click_forms(
    api: Api, executor: Executor, runtime_engine: Engine, owner_engine: Engine
) -> None:
    _notice(owner_engine)
    approval_id, _ = _approval(api, executor, runtime_engine)
    client = signed_in(api, sub="bob", scopes=[*APPROVER, "notices:read"])

    notices = client.get("/ui/notices").get_data(as_text=True)
    approvals = client.get("/ui/approvals").get_data(as_text=True)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', approvals)
    assert token is not None
    rejected = client.post(
        f"/ui/approvals/{approval_id}/decision",
        data={"csrf": token.group(1), "decision": "rejected", "next": "/ui/approvals"},
        headers={"Origin": HOST},
    )

    assert "/dismiss" in notices and 'value="/ui/notices"' in notices
    assert 'value="approved"' in approvals and 'value="rejected"' in approvals
    assert rejected.headers["Location"] == "/ui/approvals?done=rejected"
    after = client.get(rejected.headers["Location"]).get_data(as_text=True)
    assert "You rejected it." in text_of(after) and 'value="approved"' not in after


# --- every action is refused without its scope -----------------------------------------

# Every table a page action writes, whole: what a refused post must leave as it was.
_WRITTEN = ("approval", "panel_notice", "request", "execution", "bulk_action", "audit_event")


def _everything(owner_engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    with owner_engine.connect() as conn:
        return {
            table: sorted(
                (tuple(row) for row in conn.execute(text(f"SELECT * FROM {table}"))), key=repr
            )
            for table in _WRITTEN
        }


@pytest.mark.parametrize(
    ("action", "scope"),
    [
        ("approval decision", "approvals:decide"),
        ("notice dismiss", "notices:read"),
        ("dry-run start", "flows:admin"),
        ("bulk start", "executions:cancel"),
    ],
)
def test_a_valid_form_without_the_actions_scope_is_refused_and_writes_nothing(
    api: Api,
    executor: Executor,
    runtime_engine: Engine,
    owner_engine: Engine,
    action: str,
    scope: str,
) -> None:
    if action == "approval decision":
        approval_id, _ = _approval(api, executor, runtime_engine)
        url, form = f"/ui/approvals/{approval_id}/decision", {"decision": "approved"}
    elif action == "notice dismiss":
        url, form = f"/ui/notices/{_notice(owner_engine)}/dismiss", {}
    elif action == "dry-run start":
        flow_id = api.publish()["id"]
        url = f"/ui/flows/{flow_id}/dry-runs"
        form = {"transition": "power-off", "data": '{"machineId": "m-1"}'}
    else:
        waiting(api, owner_engine)
        url = "/ui/bulk"
        form = {"action": "cancel", "status": "WAITING", "reason": "outage"}
    # Bob may read every request and is the approver named, but holds no action's scope.
    client = signed_in(api, sub="bob", scopes=["requests:read-all"])
    # The CSRF token is the session's, whatever its scopes: only the scope refuses.
    token = csrf_of(client, "/ui/executions")
    before = _everything(owner_engine)

    response = client.post(url, data={"csrf": token, **form}, headers={"Origin": HOST})

    assert response.status_code == 403, response.get_data(as_text=True)
    assert scope in response.get_data(as_text=True)
    assert _everything(owner_engine) == before


def test_a_wait_under_way_is_part_of_the_story(api: Api, waiting_one: str) -> None:
    page = signed_in(api, scopes=READER).get(f"/ui/executions/{waiting_one}")

    words = text_of(page.get_data(as_text=True))

    assert "Step wait waits for command poweroff on machine m-1 (now sent)" in words


def test_a_wait_between_its_rounds_counts_the_attempt_the_execution_counts(
    api: Api, waiting_one: str, owner_engine: Engine
) -> None:
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE execution SET attempts = 1 WHERE id = :id"), {"id": waiting_one})
    view = api.get(f"/executions/{waiting_one}").get_json()
    html = signed_in(api, scopes=READER).get(f"/ui/executions/{waiting_one}").get_data(as_text=True)

    (step,) = view["steps"]
    (attempt,) = step["attempts"]
    # Under way since the wait's first round, 8 s ago, not its latest.
    assert (attempt["attempt"], attempt["status"]) == (1, "WAITING")
    assert attempt["startedAt"] == step["startedAt"]
    counts = re.findall(r"<dt>Attempts</dt><dd>(\d+)</dd>", html)
    assert counts == ["1", "1"]  # the execution's, then its wait step's


def test_the_approvals_page_offers_no_decision_to_the_person_who_asked(
    api: Api, executor: Executor, runtime_engine: Engine
) -> None:
    # alice asked for the transition and is also among the approvers named.
    _approval(api, executor, runtime_engine, approvers=["alice", "bob"])

    asker = signed_in(api, sub="alice", scopes=APPROVER).get("/ui/approvals")
    other = signed_in(api, sub="bob", scopes=APPROVER).get("/ui/approvals")

    html = asker.get_data(as_text=True)
    assert 'value="approved"' not in html and 'value="rejected"' not in html
    assert "You asked for this or own its request, so someone else decides it." in text_of(html)
    assert 'value="approved"' in other.get_data(as_text=True)
