"""The console's read pages through the app: the executions search, a request, flows, a
machine, notices, approvals, schedules and the navigation; scopes and organizations."""

from __future__ import annotations

import copy
import html
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from orquestador.approvals.store import ApprovalDraft, open_approval
from orquestador.automation.firing import fire_due_schedules
from orquestador.notices.vocabulary import CATEGORY_AUTOMATION
from orquestador.notices.writing import NoticeDraft, write_notice
from orquestador.worker.executor import Executor
from tests.integration.api_support import ALL_SCOPES, DECOMMISSION, ORG, OTHER_ORG, Api, running_api
from tests.integration.automation_support import AUTOMATION_SCOPES, moment_flow
from tests.integration.execution_page_support import (
    accepted,
    completed,
    deadline_passed,
    signed_in,
    text_of,
    waiting,
)
from tests.integration.schedule_support import SCHEDULE_SCOPES, fires, make_due, publish, put
from tests.integration.worker_support import registry_of, run_once, settings

SCRIPT = "<script>alert(1)</script>"
NOT_FOUND = "There is no such page, or you may not see it."


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _links(page: str) -> dict[str, str]:
    """Each link's words to its address (the last one of the same words wins)."""
    return {
        text_of(words).strip(): html.unescape(href)
        for href, words in re.findall(r'<a [^>]*href="([^"]+)"[^>]*>(.*?)</a>', page, re.S)
    }


def _page(client: FlaskClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "text/html"
    return response.get_data(as_text=True)


# --- the executions search -------------------------------------------------------------


def test_the_search_filters_by_machine_flow_error_status_and_time(
    api: Api, owner_engine: Engine
) -> None:
    failed = deadline_passed(api, owner_engine)
    succeeded = completed(api, owner_engine)
    client = signed_in(api)
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

    by_error = _page(client, "/ui/executions?errorCode=WAIT_DEADLINE_EXCEEDED")
    by_status = _page(client, "/ui/executions?status=SUCCEEDED&flowKey=decommission")
    by_machine = _page(client, "/ui/executions?machineId=m-1")
    other_machine = _page(client, "/ui/executions?machineId=m-2")
    other_flow = _page(client, "/ui/executions?flowKey=reboot")
    before = _page(client, f"/ui/executions?createdBefore={future}")
    after = _page(client, f"/ui/executions?createdAfter={future}")
    empty_fields = _page(
        client, "/ui/executions?id=&machineId=&flowKey=&status=&errorCode=&createdAfter="
    )

    assert failed.execution_id[:8] in by_error and succeeded.execution_id[:8] not in by_error
    assert succeeded.execution_id[:8] in by_status and failed.execution_id[:8] not in by_status
    for listing in (by_machine, before, empty_fields):
        assert failed.execution_id[:8] in listing and succeeded.execution_id[:8] in listing
    for listing in (other_machine, other_flow, after):
        assert failed.execution_id[:8] not in listing
        assert "No execution you may see matches this search." in text_of(listing)
    # The form shows the search it answered.
    assert 'name="errorCode" type="text" value="WAIT_DEADLINE_EXCEEDED"' in by_error
    assert '<option value="SUCCEEDED" selected>' in by_status


def test_the_filters_are_kept_by_the_next_page_and_the_status_links(
    api: Api, owner_engine: Engine
) -> None:
    ids = [completed(api, owner_engine).execution_id for _ in range(3)]
    client = signed_in(api)

    first = _page(client, "/ui/executions?machineId=m-1&flowKey=decommission&limit=2")
    links = _links(first)
    older = links["Older executions"]
    second = _page(client, older)

    assert "machineId=m-1" in older and "flowKey=decommission" in older and "limit=2" in older
    shown = [i for i in ids if i[:8] in first]
    assert set(shown) == set(ids[1:])  # the newest two
    assert ids[0][:8] in second and ids[1][:8] not in second
    for label in ("Failed", "Reconciliation queue", "Dry runs", "All"):
        assert "machineId=m-1" in links[label] and "flowKey=decommission" in links[label]
    assert "status=FAILED" in links["Failed"]
    assert "after=" not in links["Failed"]


def test_a_malformed_date_is_a_400_page_that_keeps_the_search(api: Api) -> None:
    response = signed_in(api).get("/ui/executions?createdAfter=yesterday&machineId=m-1")

    assert response.status_code == 400
    page = response.get_data(as_text=True)
    words = text_of(page)
    assert "This search cannot be used" in words
    assert "/createdAfter" in words and "a date and time such as" in words
    assert 'value="yesterday"' in page and 'value="m-1"' in page
    assert "Traceback" not in page


def test_the_json_listing_takes_the_same_filters(api: Api, owner_engine: Engine) -> None:
    failed = deadline_passed(api, owner_engine)
    completed(api, owner_engine)

    found = api.get("/executions?errorCode=WAIT_DEADLINE_EXCEEDED&machineId=m-1")
    by_key = api.get("/executions?flowKey=decommission&createdAfter=2000-01-01T00:00:00Z")
    refused = api.get("/executions?createdBefore=2026-01-01")

    assert [item["id"] for item in found.get_json()["items"]] == [failed.execution_id]
    assert len(by_key.get_json()["items"]) == 2
    assert refused.status_code == 400
    assert refused.get_json()["problems"][0]["path"] == "/createdBefore"


# --- a request ---------------------------------------------------------------------------


def test_the_request_page_shows_its_state_data_owner_and_executions(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine)
    client = signed_in(api)

    page = _page(client, f"/ui/requests/{arranged.request_id}")
    words = text_of(page)

    assert "State attention" in words and "Revision 3" in words
    assert "Owner alice" in words
    assert "Busy no" in words
    assert "&#34;machineId&#34;: &#34;m-1&#34;" in page or "&quot;machineId&quot;" in page
    links = _links(page)
    assert links["decommission v1 · power-off"] == f"/ui/executions/{arranged.execution_id}"
    assert links["decommission v1"] == f"/ui/flows/{arranged.flow_id}"
    assert links["m-1"] == "/ui/machines/m-1"


def test_the_execution_page_links_its_request_machine_and_flow(
    api: Api, owner_engine: Engine
) -> None:
    arranged = completed(api, owner_engine)

    links = _links(_page(signed_in(api), f"/ui/executions/{arranged.execution_id}"))
    listing = _links(_page(signed_in(api), "/ui/executions"))

    assert links[arranged.request_id] == f"/ui/requests/{arranged.request_id}"
    assert links["m-1"] == "/ui/machines/m-1"
    assert links["decommission v1"] == f"/ui/flows/{arranged.flow_id}"
    assert listing["machine m-1"] == "/ui/machines/m-1"
    assert listing["flow decommission v1"] == f"/ui/flows/{arranged.flow_id}"


def test_a_foreign_request_flow_or_machine_is_the_same_404_as_a_missing_one(
    api: Api, owner_engine: Engine
) -> None:
    foreign = completed(api, owner_engine, org=OTHER_ORG)
    client = signed_in(api)
    missing = str(uuid.uuid4())

    # Per page, a foreign id and a missing one get the very same answer.
    pairs = [
        (f"/ui/requests/{foreign.request_id}", f"/ui/requests/{missing}"),
        (f"/ui/requests/{foreign.request_id}", "/ui/requests/not-an-id"),
        (f"/ui/flows/{foreign.flow_id}", f"/ui/flows/{missing}"),
        # Only the other organization's m-1 exists.
        ("/ui/machines/m-1", "/ui/machines/never-seen"),
    ]

    for foreign_path, missing_path in pairs:
        theirs, nothing = client.get(foreign_path), client.get(missing_path)
        assert theirs.status_code == nothing.status_code == 404, foreign_path
        assert NOT_FOUND in theirs.get_data(as_text=True)
        assert theirs.get_data() == nothing.get_data(), foreign_path


def test_another_persons_request_needs_read_all(api: Api, owner_engine: Engine) -> None:
    theirs = completed(api, owner_engine, sub="bob")

    mine_only = signed_in(api).get(f"/ui/requests/{theirs.request_id}")
    everyone = signed_in(api, scopes=["requests:read-all"]).get(f"/ui/requests/{theirs.request_id}")

    assert mine_only.status_code == 404
    assert everyone.status_code == 200 and "Owner bob" in text_of(everyone.get_data(as_text=True))


# --- flows -------------------------------------------------------------------------------


def test_the_flows_list_and_a_flow_in_words(api: Api) -> None:
    first = api.publish()["id"]
    second = api.publish()["id"]
    client = signed_in(api)

    listing = _page(client, "/ui/flows")
    page = _page(client, f"/ui/flows/{first}")
    words = html.unescape(text_of(page))

    assert _links(listing)["decommission v2"] == f"/ui/flows/{second}"
    assert "2 versions" in text_of(listing)
    assert _links(page)["v2"] == f"/ui/flows/{second}"
    assert re.search(r'aria-current="page">v1<', page)
    assert "From new → where the decision table says" in words
    assert "send : machine.command v1; on error to attention" in words
    assert 'ok : when /actions/wait/status is "succeeded", to off, outcome DONE' in words
    assert "other : always, to attention, outcome REVIEW" in words
    assert "From attention → new" in words
    assert "Trigger manual" in words and "States new, off, attention" in words
    assert "<details" in page and "Data schema" in words


def test_a_flow_authors_names_show_as_text_on_the_flow_and_request_pages(
    api: Api, owner_engine: Engine
) -> None:
    definition = copy.deepcopy(DECOMMISSION)
    definition["initialState"] = SCRIPT
    definition["states"] = [SCRIPT, "off", "attention"]
    definition["transitions"][0]["from"] = [SCRIPT]
    definition["transitions"][1]["to"] = SCRIPT
    definition["dataSchema"]["description"] = SCRIPT
    arranged = deadline_passed(api, owner_engine, definition=definition)
    client = signed_in(api)

    for path in (
        f"/ui/flows/{arranged.flow_id}",
        "/ui/flows",
        f"/ui/requests/{arranged.request_id}",
        "/ui/machines/m-1",
    ):
        page = _page(client, path)
        assert "<script" not in page, path
    flow_page = _page(client, f"/ui/flows/{arranged.flow_id}")
    assert flow_page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3


def test_flows_need_their_scope(api: Api) -> None:
    flow_id = api.publish()["id"]
    client = signed_in(api, scopes=["requests:read"])

    for path in ("/ui/flows", f"/ui/flows/{flow_id}"):
        response = client.get(path)
        assert response.status_code == 403
        assert "does not allow reading flows (flows:admin)" in response.get_data(as_text=True)


# --- a machine ---------------------------------------------------------------------------


def test_the_machine_page_lists_its_commands_and_executions(api: Api, owner_engine: Engine) -> None:
    older = deadline_passed(api, owner_engine, now="timed_out")
    newer = completed(api, owner_engine)
    foreign = completed(api, owner_engine, org=OTHER_ORG)
    client = signed_in(api)

    page = _page(client, "/ui/machines/m-1")
    words = text_of(page)

    assert re.findall(r'command-status">([^<]*)<', page) == ["succeeded", "timed_out"]
    assert "poweroff" in words
    commands = page.split("Executions on this machine")[0]
    assert f"/ui/executions/{newer.execution_id}" in commands
    assert f"/ui/executions/{older.execution_id}" in commands
    assert commands.index(newer.execution_id) < commands.index(older.execution_id)
    assert "step send of execution" in words
    assert foreign.execution_id not in page and foreign.command_id not in page
    executions = page.split("Executions on this machine")[1]
    assert f"/ui/executions/{newer.execution_id}" in executions


def test_another_persons_commands_stay_hidden_without_read_all(
    api: Api, owner_engine: Engine
) -> None:
    theirs = completed(api, owner_engine, sub="bob")
    mine = completed(api, owner_engine)

    page = _page(signed_in(api), "/ui/machines/m-1")

    assert mine.command_id in page and theirs.command_id not in page
    assert theirs.execution_id not in page


# --- notices -----------------------------------------------------------------------------


def _notice(engine: Engine, org: str, title: str, execution_id: str | None = None) -> str:
    draft = NoticeDraft(
        org_id=org,
        external_key=f"{uuid.uuid4()}:tell",
        title=title,
        body="Machine m-1 has 3% free on /var.",
        severity="warning",
        category=CATEGORY_AUTOMATION,
        request_id=None,
        execution_id=uuid.UUID(execution_id) if execution_id else None,
    )
    with engine.begin() as conn:
        return str(write_notice(conn, draft, email_requested=False).notice_id)


def test_the_notices_panel_shows_open_notices_and_all_on_ask(
    api: Api, owner_engine: Engine
) -> None:
    arranged = completed(api, owner_engine)
    _notice(owner_engine, ORG, "Disk almost full", arranged.execution_id)
    gone = _notice(owner_engine, ORG, f"Old news {SCRIPT}")
    _notice(owner_engine, OTHER_ORG, "Their secret notice")
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE panel_notice SET dismissed_at = now() WHERE id = :id"), {"id": gone}
        )
    client = signed_in(api, scopes=["requests:read", "notices:read"])

    page = _page(client, "/ui/notices")
    everything = _page(client, "/ui/notices?show=all")

    words = text_of(page)
    assert "Disk almost full" in words and "warning" in words and "automation" in words
    assert "Machine m-1 has 3% free on /var." in words
    # What became of the e-mail, in words, never the stored enum.
    assert "no e-mail (the flow does not send one)" in words and "off_on_node" not in words
    assert f"/ui/executions/{arranged.execution_id}" in page
    assert "Old news" not in words and "Their secret notice" not in words
    assert "Old news" in text_of(everything) and "dismissed" in text_of(everything)
    assert "<script" not in everything
    assert "Their secret notice" not in everything
    assert '<div class="actions">' in page


def test_notices_need_their_scope(api: Api) -> None:
    response = signed_in(api).get("/ui/notices")

    assert response.status_code == 403
    assert "notices:read" in response.get_data(as_text=True)


# --- approvals ---------------------------------------------------------------------------


def _approval(engine: Engine, org: str, execution_id: str, request_id: str, **draft: object) -> str:
    fields = {
        "org_id": org,
        "request_id": uuid.UUID(request_id),
        "execution_id": uuid.UUID(execution_id),
        "action_id": "ok",
        "external_key": f"{execution_id}:ok",
        "title": "Reboot m-1?",
        "body": "It has been up for 400 days.",
        "subjects": ["alice"],
        "scope": None,
        "deadline_seconds": 3600,
        "actor": "carol",
        **draft,
    }
    with engine.begin() as conn:
        row, _ = open_approval(conn, ApprovalDraft(**fields))  # type: ignore[arg-type]
    return str(row.id)


def test_the_approvals_page_shows_what_waits_for_the_person(api: Api, owner_engine: Engine) -> None:
    live = waiting(api, owner_engine, sub="carol")
    ended = completed(api, owner_engine, sub="carol")
    foreign = waiting(api, owner_engine, org=OTHER_ORG)
    _approval(owner_engine, ORG, live.execution_id, live.request_id, title=f"Reboot {SCRIPT}")
    _approval(owner_engine, ORG, ended.execution_id, ended.request_id, title="Too late")
    _approval(owner_engine, OTHER_ORG, foreign.execution_id, foreign.request_id, title="Not yours")
    client = signed_in(api, scopes=["requests:read", "approvals:decide"])

    page = _page(client, "/ui/approvals")
    closed = _page(client, "/ui/approvals?status=closed")

    words = text_of(page)
    assert "Reboot" in words and "<script" not in page
    assert "It has been up for 400 days." in words
    assert "Asked by carol" in words
    assert re.search(r"Time left (59 min [0-9]+ s|1 h)", words)
    assert f"/ui/executions/{live.execution_id}" in page
    assert "Too late" not in words and "Not yours" not in words
    assert "Too late" in text_of(closed) and "its execution is SUCCEEDED" in text_of(closed)
    assert "Not yours" not in closed
    assert '<div class="actions">' in page


def test_approvals_need_their_scope(api: Api) -> None:
    response = signed_in(api).get("/ui/approvals")

    assert response.status_code == 403
    assert "approvals:decide" in response.get_data(as_text=True)


# --- who started an execution -----------------------------------------------------------


def _started_by(api: Api, execution_id: str) -> str:
    page = _page(
        signed_in(api, sub="viewer", scopes=["requests:read-all"]), f"/ui/executions/{execution_id}"
    )
    found = re.search(r'<dd class="started-by">(.*?)</dd>', page, re.S)
    assert found, "no Started by on the execution page"
    # text_of leaves a space where a tag ended, before a comma too.
    return re.sub(r" ,", ",", html.unescape(text_of(found.group(1)))).strip()


def test_the_execution_page_names_the_person_who_asked(api: Api) -> None:
    _, _, execution_id = accepted(api, sub="carol")

    assert _started_by(api, execution_id) == "carol"


def test_an_event_names_its_moment_plan_and_time_and_a_later_transition_its_person(
    api: Api, runtime_engine: Engine
) -> None:
    flow = moment_flow(
        states=["new", "greeted", "checked"],
        transitions=[
            {"id": "greet", "from": ["new"], "to": "greeted"},
            {"id": "check", "from": ["greeted"], "to": "checked"},
        ],
    )
    panel = {"sub": "panel", "scopes": AUTOMATION_SCOPES}
    api.client().put("/api/v1/plans/vps", json={"name": "vps"}, headers=api.headers(**panel))
    flow_id = api.publish(flow, **panel)["id"]
    bound = api.client().put(
        "/api/v1/plans/vps/bindings/provisioned",
        json={"flowId": flow_id},
        headers=api.headers(**panel),
    )
    assert bound.status_code == 200, bound.get_data(as_text=True)
    event = {
        "id": "evt-1",
        "moment": "provisioned",
        "planId": "vps",
        "machineId": "m-42",
        "occurredAt": "2026-11-30T10:00:00+00:00",
        "data": {},
    }
    started = api.client().post("/api/v1/events", json=event, headers=api.headers(**panel))
    assert started.status_code == 202, started.get_data(as_text=True)
    body = started.get_json()
    assert run_once(runtime_engine, Executor(registry_of(), settings())) == "SUCCEEDED"
    # The next transition of the same request, whose data still holds the event.
    later = api.transition(body["requestId"], "check", 3, **panel)
    assert later.status_code == 202, later.get_data(as_text=True)

    assert _started_by(api, body["executionId"]) == (
        "platform event provisioned of plan vps, at 2026-11-30 10:00:00 UTC"
    )
    assert _started_by(api, later.get_json()["executionId"]) == "panel"


def test_a_fire_names_its_schedule_and_fire_time_and_lookalike_data_does_not(
    api: Api, runtime_engine: Engine
) -> None:
    flow_id = publish(api)
    assert put(api, "tick", {"flowId": flow_id, "everySeconds": 600}).status_code == 201
    fire_time = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    make_due(runtime_engine, "tick", fire_time)
    fire_due_schedules(runtime_engine, max_attempts=3, now=fire_time + timedelta(seconds=1))
    ((_, _, fired),) = fires(runtime_engine, "tick")
    # A person's request to the same flow, with data that looks like a fire's.
    request_id = api.create_request(
        flow_id, {"scheduleId": "tick", "fireTime": "2026-03-01T09:30:00+00:00", "data": {}}
    )["id"]
    by_hand = api.transition(request_id, "run", 1)
    assert by_hand.status_code == 202, by_hand.get_data(as_text=True)

    assert _started_by(api, str(fired)) == "schedule tick, fire time 2026-03-01 09:30:00 UTC"
    story = html.unescape(text_of(_page(signed_in(api), f"/ui/executions/{fired}")))
    assert "Schedule tick's fire asked for run from new at revision 2 (flow tick v1)." in story
    assert _started_by(api, by_hand.get_json()["executionId"]) == "alice"


# --- schedules ---------------------------------------------------------------------------


def test_the_schedules_page_shows_timing_and_where_firing_stands(api: Api) -> None:
    flow_id = publish(api)
    body = {"flowId": flow_id, "cron": "0 3 * * *", "timezone": "Europe/Madrid", "paused": True}
    assert put(api, "nightly", body).status_code == 201
    assert put(api, "often", {"flowId": flow_id, "everySeconds": 90}).status_code == 201
    foreign_flow = publish(api, org=OTHER_ORG)
    assert put(api, "theirs", {"flowId": foreign_flow, "everySeconds": 60}, org=OTHER_ORG)
    client = signed_in(api, scopes=SCHEDULE_SCOPES)

    page = _page(client, "/ui/schedules")
    words = text_of(page)

    assert "nightly" in words and "cron 0 3 * * *" in words and "Europe/Madrid" in words
    assert "Paused yes" in words and "Missed 0" in words
    assert "every 1 min 30 s" in words and "Next fire" in words and "Last fired" in words
    assert _links(page)["tick v1"] == f"/ui/flows/{flow_id}"
    assert "theirs" not in words


def test_schedules_need_their_scope(api: Api) -> None:
    response = signed_in(api).get("/ui/schedules")

    assert response.status_code == 403
    assert "plans:admin" in response.get_data(as_text=True)


# --- navigation --------------------------------------------------------------------------


def _sections(page: str) -> list[str]:
    nav = re.search(r'<nav class="sections"[^>]*>(.*?)</nav>', page, re.S)
    assert nav is not None
    return [text_of(words).strip() for words in re.findall(r"<a [^>]*>(.*?)</a>", nav.group(1))]


def test_the_navigation_shows_what_the_person_may_open(api: Api, owner_engine: Engine) -> None:
    everything = [*ALL_SCOPES, "notices:read", "approvals:decide", "plans:admin"]
    arranged = completed(api, owner_engine)
    full = signed_in(api, scopes=everything)
    reader = signed_in(api, scopes=["requests:read"])

    listing = _page(full, "/ui/executions")
    queue = _page(full, "/ui/executions?status=RECONCILIATION_REQUIRED")
    flow = _page(full, f"/ui/flows/{arranged.flow_id}")

    assert _sections(listing) == [
        "Executions",
        "Reconciliation",
        "Approvals",
        "Notices",
        "Flows",
        "Schedules",
    ]
    assert _sections(_page(reader, "/ui/executions")) == ["Executions", "Reconciliation"]
    current = r'<nav class="sections".*?aria-current="page">([^<]*)<'
    assert re.search(current, listing, re.S).group(1) == "Executions"  # type: ignore[union-attr]
    assert re.search(current, queue, re.S).group(1) == "Reconciliation"  # type: ignore[union-attr]
    assert re.search(current, flow, re.S).group(1) == "Flows"  # type: ignore[union-attr]
    # A reader without flows:admin is not sent to a page that would refuse them.
    assert "/ui/flows/" not in _page(reader, f"/ui/executions/{arranged.execution_id}")
