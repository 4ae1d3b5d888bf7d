"""The execution pages, through the app: sign-in, the list, then beside now, access."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from orquestador.api.pages.routes import SESSION_COOKIE, STATUS_LINKS
from orquestador.db.schema import EXECUTION_STATUSES
from tests.integration.api_support import OTHER_ORG, Api, running_api
from tests.integration.execution_page_support import (
    HOST,
    cancel_directly,
    completed,
    deadline_passed,
    dry_run,
    fixed_destination,
    insert_command,
    point_audit_at,
    signed_in,
    text_of,
    twin,
    waiting,
)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def test_not_signed_in_goes_to_the_sign_in_page_and_comes_back(api: Api) -> None:
    client = api.client()

    response = client.get("/ui/executions?status=FAILED")

    assert response.status_code == 303
    assert response.headers["Location"].startswith("/ui/login?next=")
    login = client.get(response.headers["Location"])
    assert login.status_code == 200 and 'name="token"' in login.get_data(as_text=True)
    answer = client.post(
        "/ui/login",
        data={"token": api.token(), "next": "/ui/executions?status=FAILED"},
        headers={"Origin": HOST},
    )
    assert answer.headers["Location"] == "/ui/executions?status=FAILED"
    assert client.get("/ui/executions?status=FAILED").status_code == 200


def test_sign_in_never_sends_a_person_to_another_site(api: Api) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "/api/v1/x"):
        response = api.client().post(
            "/ui/login", data={"token": api.token(), "next": target}, headers={"Origin": HOST}
        )
        assert response.headers["Location"] == "/ui/executions", target


def test_the_page_of_a_deadline_exit_shows_sent_then_and_timed_out_now(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine, now="timed_out")

    page = signed_in(api).get(f"/ui/executions/{arranged.execution_id}")

    assert page.status_code == 200
    words = text_of(page.get_data(as_text=True))
    assert "Then, when the flow decided" in words
    assert re.search(r"Then, when the flow decided .* Status sent .* Now Status timed_out", words)
    assert "WAIT_DEADLINE_EXCEEDED" in words
    assert "error exit chose the destination" in words
    assert "Destination attention" in words
    assert "the command was still sent at the deadline" in words


def test_a_purged_command_reads_no_longer_in_the_records(api: Api, owner_engine: Engine) -> None:
    arranged = deadline_passed(api, owner_engine, now="timed_out", purged=True)

    words = text_of(
        signed_in(api).get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True)
    )

    assert "no longer in the records" in words
    assert "timed_out" not in words
    # Then still says what the step saw; now never repeats it.
    now = words.split("Now", 1)[1]
    assert "sent" not in now.split("Steps")[0]


def test_a_completed_run_shows_hit_policy_rules_destination_and_outcome(
    api: Api, owner_engine: Engine
) -> None:
    arranged = completed(api, owner_engine)

    words = text_of(
        signed_in(api).get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True)
    )

    assert "Hit policy FIRST" in words
    assert "Matched rules ok" in words
    assert "Destination off" in words
    assert "Outcome DONE" in words


def test_a_dry_run_shows_what_it_would_have_done_and_only_under_dry_runs(
    api: Api, owner_engine: Engine
) -> None:
    simulated = dry_run(api, owner_engine)
    client = signed_in(api)

    page = text_of(client.get(f"/ui/executions/{simulated}").get_data(as_text=True))
    listed = client.get("/ui/executions").get_data(as_text=True)
    dry = client.get("/ui/executions?simulation=true").get_data(as_text=True)

    assert "Would have done" in page
    assert "send poweroff to machine m-1" in page
    assert simulated not in listed
    assert simulated in dry


def test_the_reconciliation_queue_is_one_click_from_the_list(
    api: Api, owner_engine: Engine
) -> None:
    parked = deadline_passed(api, owner_engine).execution_id
    other = completed(api, owner_engine).execution_id
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'RECONCILIATION_REQUIRED' WHERE id = %s", (parked,)
        )
    client = signed_in(api)

    listing = client.get("/ui/executions").get_data(as_text=True)
    link = re.search(r'href="([^"]+)">Reconciliation queue<', listing)
    assert link is not None
    queue = client.get(link.group(1).replace("&amp;", "&")).get_data(as_text=True)

    assert parked[:8] in queue and other[:8] not in queue
    assert parked[:8] in listing and other[:8] in listing
    page = text_of(client.get(f"/ui/executions/{parked}").get_data(as_text=True))
    assert "A person must decide what happened" in page
    assert "Someone holding executions:reconcile decides it." in page


def test_every_status_has_a_filter_link() -> None:
    assert {status for status, _ in STATUS_LINKS} == set(EXECUTION_STATUSES)


def test_foreign_missing_and_malformed_executions_are_the_same_page(
    api: Api, owner_engine: Engine
) -> None:
    theirs = deadline_passed(api, owner_engine, org=OTHER_ORG).execution_id
    client = signed_in(api)

    pages = [
        client.get(f"/ui/executions/{theirs}"),
        client.get("/ui/executions/00000000-0000-4000-8000-000000000000"),
        client.get("/ui/executions/not-an-id"),
    ]

    assert {p.status_code for p in pages} == {404}
    assert len({p.get_data() for p in pages}) == 1
    assert theirs not in pages[0].get_data(as_text=True)


def test_another_owner_s_execution_is_hidden_unless_the_token_reads_all(
    api: Api, owner_engine: Engine
) -> None:
    bobs = deadline_passed(api, owner_engine, sub="bob").execution_id

    alice = signed_in(api)
    auditor = signed_in(api, sub="auditor", scopes=["requests:read-all"])

    assert alice.get(f"/ui/executions/{bobs}").status_code == 404
    assert bobs not in alice.get("/ui/executions").get_data(as_text=True)
    assert auditor.get(f"/ui/executions/{bobs}").status_code == 200


def test_a_tampered_audit_row_shows_nothing_of_another_org_s_command(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine, now="sent")
    # A status this page could show only by reading the other organization's row.
    foreign = insert_command(owner_engine, org=OTHER_ORG, status="succeeded", key="theirs:send")
    point_audit_at(owner_engine, arranged.execution_id, foreign)

    html = signed_in(api).get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True)

    assert "no longer in the records" in text_of(html)
    assert re.findall(r'class="command-status">([^<]*)<', html) == ["sent"]


def test_a_bad_status_filter_is_a_400_page(api: Api) -> None:
    response = signed_in(api).get("/ui/executions?status=BOGUS")

    assert response.status_code == 400
    assert response.mimetype == "text/html"
    assert "/status" in response.get_data(as_text=True)


def test_sign_out_forgets_the_cookie(api: Api) -> None:
    client = signed_in(api)

    response = client.post("/ui/logout", headers={"Origin": HOST})

    assert response.status_code == 303
    assert client.get_cookie(SESSION_COOKIE, path="/ui") is None
    assert client.get("/ui/executions").status_code == 303


def test_the_list_reads_the_same_number_of_statements_for_one_execution_or_many(
    api: Api, owner_engine: Engine
) -> None:
    from sqlalchemy import event

    from orquestador.api.context import EXTENSION_KEY

    deadline_passed(api, owner_engine)
    client = signed_in(api)
    statements: list[str] = []
    engine = api.app.extensions[EXTENSION_KEY].engine.get()

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        assert client.get("/ui/executions").status_code == 200
        one = len(statements)
        for _ in range(4):
            deadline_passed(api, owner_engine)
        statements.clear()
        page = client.get("/ui/executions").get_data(as_text=True)
        five = len(statements)
    finally:
        event.remove(engine, "before_cursor_execute", count)

    # Each execution once in the desk's table and once in the phone's cards.
    assert page.count('<span class="code">WAIT_DEADLINE_EXCEEDED</span>') == 10
    assert page.count("<tr>") == 6  # the header row and one per execution
    assert five == one


def test_a_waiting_step_shows_what_it_waits_for_and_a_cancelled_one_no_marker(
    api: Api, owner_engine: Engine
) -> None:
    client = signed_in(api)
    arranged = waiting(api, owner_engine)

    page = text_of(client.get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True))
    cancel_directly(owner_engine, arranged.execution_id)
    after = text_of(client.get(f"/ui/executions/{arranged.execution_id}").get_data(as_text=True))

    assert "Waiting for command poweroff --grace 30 on machine m-1" in page
    assert "Status now sent" in page and "Deadline" in page
    assert re.search(r"Time left ([1-9]|1[0-9]|2[0-2]) s", page), page
    assert "Not decided yet." in page
    for marker in ("NOT_READY", "FAILED", "Not decided yet", "Waiting for"):
        assert marker not in after, marker
    assert "STOPPED" in after and "The wait stopped when the execution ended" in after
    assert "Cancelled before anything was decided." in after


def test_a_fixed_destination_and_a_notify_step_read_as_what_they_are(
    api: Api, owner_engine: Engine
) -> None:
    client = signed_in(api)
    execution_id = fixed_destination(api, owner_engine)

    page = text_of(client.get(f"/ui/executions/{execution_id}").get_data(as_text=True))

    assert "This transition has a fixed destination: no decision table was consulted." in page
    assert "Matched rules" not in page and "Hit policy" not in page
    assert "Nothing to look up" not in page and "Now" not in page
    assert "Then, when the flow decided" in page and "queued" in page


def test_the_search_box_finds_an_execution_by_its_short_id(api: Api, owner_engine: Engine) -> None:
    client = signed_in(api)
    mine = completed(api, owner_engine)
    foreign = completed(api, owner_engine, org=OTHER_ORG)

    found = client.get(f"/ui/executions?id={mine.execution_id[:8]}")
    whole = client.get(f"/ui/executions?id={mine.execution_id}")
    other = client.get(f"/ui/executions?id={foreign.execution_id[:8]}")
    short = client.get("/ui/executions?id=abc1234")

    assert found.status_code == whole.status_code == 303
    assert found.headers["Location"] == whole.headers["Location"]
    assert found.headers["Location"].endswith(f"/ui/executions/{mine.execution_id}")
    assert other.status_code == 200
    assert "No execution you may see has an id starting with" in other.get_data(as_text=True)
    assert foreign.execution_id not in other.get_data(as_text=True)
    assert short.status_code == 400
    assert "at least 8 of its first hex digits" in short.get_data(as_text=True)
    listing = client.get("/ui/executions").get_data(as_text=True)
    assert 'name="id"' in listing and "machine m-1" in listing


def test_a_short_id_two_executions_share_lists_both(api: Api, owner_engine: Engine) -> None:
    client = signed_in(api)
    arranged = completed(api, owner_engine)
    unrelated = completed(api, owner_engine)
    other_id = arranged.execution_id[:8] + "-0000-4000-8000-000000000000"
    twin(owner_engine, arranged.execution_id, other_id)

    page = client.get(f"/ui/executions?id={arranged.execution_id[:8]}")

    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert arranged.execution_id in html and other_id in html
    assert unrelated.execution_id not in html


def test_the_longest_first_is_one_page_and_an_order_it_does_not_know_is_said(
    api: Api, owner_engine: Engine
) -> None:
    for _ in range(3):
        completed(api, owner_engine)
    client = signed_in(api)

    longest = client.get("/ui/executions?sort=duration&limit=2")
    unknown = client.get("/ui/executions?sort=slowest")
    paged = client.get("/ui/executions?sort=duration&after=x")

    html = longest.get_data(as_text=True)
    assert longest.status_code == 200 and "Older executions" not in html
    assert "The longest 2 only" in text_of(html)
    assert unknown.status_code == 400 and "duration (longest first)" in text_of(
        unknown.get_data(as_text=True)
    )
    assert paged.status_code == 400
