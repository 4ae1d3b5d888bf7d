"""The notices and notification-preferences API: the caller's organization only, clear 4xx."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from orquestador.notices.vocabulary import CATEGORY_AUTOMATION
from orquestador.notices.writing import NoticeDraft, write_notice
from tests.integration.api_support import ORG, OTHER_ORG, Api, problem, running_api
from tests.integration.notice_support import (
    new_mailer,
    outbox,
    queue_email,
    running,
    set_preferences,
)
from tests.integration.worker_support import wait_until
from tests.smtp_sink import running_sink

READER = {"scopes": ["notices:read"]}
ADMIN = {"scopes": ["org:admin"]}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _notice(engine, org: str = ORG, title: str = "Backup failed", *, test: bool = False) -> str:
    draft = NoticeDraft(
        org_id=org,
        external_key=f"{uuid.uuid4()}:tell",
        title=title,
        body="The nightly backup of m-1 failed.",
        severity="warning",
        category=CATEGORY_AUTOMATION,
        request_id=None,
        execution_id=uuid.uuid4(),
    )
    with engine.begin() as conn:
        return str(write_notice(conn, draft, email_requested=False, test=test).notice_id)


def _titles(response) -> list[str]:
    assert response.status_code == 200, response.get_data(as_text=True)
    return [item["title"] for item in response.get_json()["items"]]


def test_notices_are_listed_newest_first_for_the_callers_organization_only(api, runtime_engine):
    first = _notice(runtime_engine, title="first")
    _notice(runtime_engine, OTHER_ORG, title="theirs")
    _notice(runtime_engine, title="dry run", test=True)
    _notice(runtime_engine, title="last")

    response = api.get("/notices", **READER)

    # The panel is the real runs': a dry run's notice only when asked for, and then alone.
    assert _titles(response) == ["last", "first"]
    rehearsed = api.get("/notices?test=true", **READER)
    assert _titles(rehearsed) == ["dry run"]
    (dry,) = rehearsed.get_json()["items"]
    assert dry["test"] is True and dry["email"] == "simulation"
    assert api.get("/notices?test=yes", **READER).status_code == 400
    items = {item["title"]: item for item in response.get_json()["items"]}
    assert items["first"] | {"createdAt": None} == {
        "id": first,
        "category": "automation",
        "severity": "warning",
        "title": "first",
        "body": "The nightly backup of m-1 failed.",
        "email": "off_on_node",
        "test": False,
        "requestId": None,
        "executionId": items["first"]["executionId"],
        "createdAt": None,
        "dismissedAt": None,
        "dismissedBy": None,
    }
    assert _titles(api.get("/notices", org=OTHER_ORG, **READER)) == ["theirs"]


def test_pages_follow_the_cursor(api, runtime_engine):
    for n in range(5):
        _notice(runtime_engine, title=f"n{n}")
    page = api.get("/notices?limit=2", **READER).get_json()
    seen = [item["title"] for item in page["items"]]
    while page["next"]:
        page = api.get(f"/notices?limit=2&after={page['next']}", **READER).get_json()
        seen += [item["title"] for item in page["items"]]
    assert seen == ["n4", "n3", "n2", "n1", "n0"]


def test_a_dismissed_notice_leaves_the_list_unless_asked_for(api, runtime_engine):
    kept = _notice(runtime_engine, title="kept")
    gone = _notice(runtime_engine, title="gone")

    response = api.post(f"/notices/{gone}/dismiss", None, **READER)
    assert response.status_code == 200
    dismissed_at = response.get_json()["dismissedAt"]
    assert dismissed_at is not None
    again = api.post(f"/notices/{gone}/dismiss", None, **READER)
    assert again.get_json()["dismissedAt"] == dismissed_at

    assert _titles(api.get("/notices", **READER)) == ["kept"]
    assert _titles(api.get("/notices?includeDismissed=true", **READER)) == ["gone", "kept"]
    assert kept


def test_another_organizations_notice_and_a_missing_one_are_the_same_404(api, runtime_engine):
    theirs = _notice(runtime_engine, OTHER_ORG)
    foreign = api.post(f"/notices/{theirs}/dismiss", None, **READER)
    missing = api.post(f"/notices/{uuid.uuid4()}/dismiss", None, **READER)
    malformed = api.post("/notices/not-an-id/dismiss", None, **READER)

    assert foreign.status_code == missing.status_code == malformed.status_code == 404
    assert foreign.get_data() == missing.get_data() == malformed.get_data()
    with runtime_engine.connect() as conn:
        assert conn.scalar(text("SELECT dismissed_at FROM panel_notice")) is None


@pytest.mark.parametrize(
    ("query", "name"),
    [("includeDismissed=yes", "includeDismissed"), ("limit=0", "limit"), ("after=x", "after")],
)
def test_bad_query_parameters_are_400_naming_them(api, query, name):
    body = problem(api.get(f"/notices?{query}", **READER))
    assert body["status"] == 400 and body["code"] == "QUERY_INVALID"
    assert body["problems"][0]["path"] == f"/{name}"


def test_notices_need_the_notices_scope(api):
    assert api.get("/notices", scopes=["requests:read"]).status_code == 403
    assert api.get("/notices", **ADMIN).status_code == 403


def _put(api: Api, body, org: str = ORG, **who):
    path = f"/api/v1/orgs/{org}/notification-preferences"
    return api.client().put(path, json=body, headers=api.headers(**{**ADMIN, **who}))


def test_preferences_start_empty_and_are_replaced_whole(api, runtime_engine):
    empty = api.get(f"/orgs/{ORG}/notification-preferences", **ADMIN)
    assert empty.status_code == 200
    assert empty.get_json() == {"org": ORG, "optOut": [], "recipients": [], "updatedAt": None}

    saved = _put(
        api,
        {
            "optOut": ["automation", "automation"],
            "recipients": ["ops@example.com", "OPS@example.com", "oncall+db@ops.example.org"],
        },
    )
    assert saved.status_code == 200, saved.get_data(as_text=True)
    assert saved.get_json()["optOut"] == ["automation"]
    assert saved.get_json()["recipients"] == ["ops@example.com", "oncall+db@ops.example.org"]
    assert api.get(f"/orgs/{ORG}/notification-preferences", **ADMIN).get_json() == (
        saved.get_json()
    )

    cleared = _put(api, {"optOut": [], "recipients": ["ops@example.com"]}).get_json()
    assert (cleared["optOut"], cleared["recipients"]) == ([], ["ops@example.com"])
    with runtime_engine.connect() as conn:
        changes = conn.execute(
            text("""SELECT actor, detail FROM audit_event
                    WHERE kind = 'NOTIFICATION_PREFERENCES_CHANGED' ORDER BY id""")
        ).all()
    assert [(row.actor, row.detail) for row in changes] == [
        ("alice", {"optOut": ["automation"], "recipients": 2}),
        ("alice", {"optOut": [], "recipients": 1}),
    ]


def test_unknown_categories_and_unusable_addresses_are_422_each_at_its_place(api, runtime_engine):
    _put(api, {"optOut": [], "recipients": ["ops@example.com"]})
    body = {
        "optOut": ["automation", "marketing"],
        "recipients": [
            "ops@example.com",
            "Ops <ops@example.com>",
            "no-at-sign",
            "a@b",
            "x@example.com\r\nBcc: all@example.com",
            '"quoted"@example.com',
        ],
    }
    refused = problem(_put(api, body))

    assert refused["status"] == 422 and refused["code"] == "PREFERENCES_INVALID"
    assert [p["path"] for p in refused["problems"]] == [
        "/optOut/1",
        "/recipients/1",
        "/recipients/2",
        "/recipients/3",
        "/recipients/4",
        "/recipients/5",
    ]
    assert "automation" in refused["problems"][0]["message"]
    kept = api.get(f"/orgs/{ORG}/notification-preferences", **ADMIN).get_json()
    assert (kept["optOut"], kept["recipients"]) == ([], ["ops@example.com"])


@pytest.mark.parametrize(
    "body",
    [{"optOut": []}, {"optOut": "automation", "recipients": []}, {"optOut": [], "recipients": [1]}],
)
def test_a_body_of_the_wrong_shape_is_422(api, body):
    assert problem(_put(api, body))["status"] == 422


def test_too_many_recipients_is_422(api):
    many = [f"user{n}@example.com" for n in range(21)]
    refused = problem(_put(api, {"optOut": [], "recipients": many}))
    assert refused["problems"] == [{"path": "/recipients", "message": "at most 20 addresses"}]


def test_another_organizations_preferences_are_404_read_or_written(api, runtime_engine):
    read = api.get(f"/orgs/{OTHER_ORG}/notification-preferences", **ADMIN)
    written = _put(api, {"optOut": ["automation"], "recipients": []}, org=OTHER_ORG)
    unknown = api.get("/orgs/no-such-org/notification-preferences", **ADMIN)

    assert read.status_code == written.status_code == unknown.status_code == 404
    assert read.get_data() == written.get_data() == unknown.get_data()
    with runtime_engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM notification_opt_out")) == 0


def test_preferences_need_the_org_admin_scope(api):
    assert api.get(f"/orgs/{ORG}/notification-preferences", **READER).status_code == 403
    response = _put(api, {"optOut": [], "recipients": []}, scopes=["notices:read"])
    assert response.status_code == 403


def test_sixteen_replacements_at_once_all_succeed_and_one_of_them_stands(api, runtime_engine):
    start = threading.Barrier(16, timeout=20)
    answers: list[int] = []
    bodies = [
        {"optOut": ["automation"] if n % 2 else [], "recipients": [f"ops{n}@example.com"]}
        for n in range(16)
    ]

    def replace(body) -> None:
        client = api.client()
        headers = api.headers(**ADMIN)
        start.wait()
        path = f"/api/v1/orgs/{ORG}/notification-preferences"
        answers.append(client.put(path, json=body, headers=headers).status_code)

    threads = [threading.Thread(target=replace, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert answers == [200] * 16
    final = api.get(f"/orgs/{ORG}/notification-preferences", **ADMIN).get_json()
    stood = {"optOut": final["optOut"], "recipients": final["recipients"]}
    assert stood in bodies


def _listed_email(api: Api, notice_id: uuid.UUID) -> str:
    items = api.get("/notices", **READER).get_json()["items"]
    return next(item["email"] for item in items if item["id"] == str(notice_id))


def test_a_notices_email_says_delivered_once_the_smtp_server_took_it(api, runtime_engine):
    set_preferences(runtime_engine, org=ORG)
    notice = queue_email(runtime_engine, org=ORG, execution_id=uuid.uuid4())
    assert _listed_email(api, notice.notice_id) == "queued"

    with running_sink() as sink, running(new_mailer(runtime_engine, sink.url)):
        sink.wait_for(1)
        wait_until(lambda: outbox(runtime_engine)[0].status == "sent", what="sent")

    assert _listed_email(api, notice.notice_id) == "delivered"


def test_a_notices_email_says_failed_once_the_mailer_gave_up(api, runtime_engine):
    set_preferences(runtime_engine, org=ORG, recipients=["nobody@invalid.example"])
    notice = queue_email(runtime_engine, org=ORG, execution_id=uuid.uuid4())

    with running_sink() as sink:
        sink.refuse_recipients = True
        with running(new_mailer(runtime_engine, sink.url)):
            wait_until(lambda: outbox(runtime_engine)[0].status == "failed", what="failed")

    assert _listed_email(api, notice.notice_id) == "failed"
