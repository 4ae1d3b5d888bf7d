"""Every page, in a real headless Chromium at 1280 px and 390 px, meets the quality bar of
tests/browser/page_quality.py: no sideways scrolling, named controls the Tab key reaches,
nothing refused by the Content-Security-Policy, and no serious axe-core violation.
Screenshots land in test-artifacts/pages/.

To check a new page, append a `PageCase` to `PAGES`: a name for its screenshots, and a
function that makes the page's data from the `Site` (the API, the owner's and the
runtime's engines) and returns the page's path. For example::

    def _a_flow(site: Site) -> str:
        flow = site.api.publish()
        return f"/ui/flows/{flow['id']}"

    PAGES.append(PageCase("flow", _a_flow))

A page seen before signing in says `signed_in=False`. Give a page one case per state
that shows different parts of it (empty, waiting, failed...).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.approvals.store import ApprovalDraft, open_approval
from orquestador.queue.claims import claim_round
from tests.browser.browser_support import forget_every_cookie, keep_session, serving, start_chromium
from tests.browser.page_quality import (
    axe_core,  # noqa: F401 (the fixture: installs axe-core, or skips saying why)
    check_page,
)
from tests.integration.api_support import ALL_SCOPES, ORG, Api, running_api
from tests.integration.execution_page_support import (
    completed,
    deadline_passed,
    dry_run,
    twin,
    waiting,
)
from tests.integration.schedule_support import publish as publish_schedule_flow
from tests.integration.schedule_support import put as put_schedule

# Before the database and the browser: without axe-core every test here is skipped.
pytestmark = pytest.mark.usefixtures("axe_core")


# Every section and action shows: the pages are checked with all they can hold.
EVERY_SCOPE = [
    *ALL_SCOPES,
    "notices:read",
    "approvals:decide",
    "plans:admin",
    "executions:cancel",
    "executions:reconcile",
]


@dataclass(frozen=True)
class Site:
    """The app served over HTTP on a fresh test database, and what arranges its data."""

    api: Api
    base: str
    owner_engine: Engine
    runtime_engine: Engine


@dataclass(frozen=True)
class PageCase:
    """A page to check: its artifacts' name, and what makes its data and returns its path."""

    name: str
    arrange: Callable[[Site], str]
    signed_in: bool = True


def _requires_reconciliation(site: Site, execution_id: str) -> None:
    with site.owner_engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = 'RECONCILIATION_REQUIRED' WHERE id = :id"),
            {"id": execution_id},
        )


def _executions_of_every_kind(site: Site) -> None:
    """Waiting, failed past a deadline, succeeded, waiting for a person, and a dry run."""
    waiting(site.api, site.owner_engine)
    deadline_passed(site.api, site.owner_engine, now="timed_out")
    completed(site.api, site.owner_engine)
    _requires_reconciliation(site, completed(site.api, site.owner_engine).execution_id)
    dry_run(site.api, site.owner_engine)


def _list(site: Site) -> str:
    _executions_of_every_kind(site)
    return "/ui/executions"


def _by_duration(site: Site) -> str:
    _executions_of_every_kind(site)
    return "/ui/executions?sort=duration"


def _dry_runs(site: Site) -> str:
    _executions_of_every_kind(site)
    return "/ui/executions?simulation=true"


def _search_finding_two(site: Site) -> str:
    """A short id two executions start with: the list of both, the search field filled."""
    found = completed(site.api, site.owner_engine).execution_id
    twin(site.owner_engine, found, found[:9] + str(uuid.uuid4())[9:])
    return f"/ui/executions?id={found[:8]}"


def _search_finding_none(site: Site) -> str:
    completed(site.api, site.owner_engine)
    return "/ui/executions?id=00000000"


def _waiting(site: Site) -> str:
    return f"/ui/executions/{waiting(site.api, site.owner_engine).execution_id}"


def _cancel_form(site: Site) -> str:
    return f"/ui/executions/{waiting(site.api, site.owner_engine).execution_id}/cancel"


def _bulk_preview(site: Site) -> str:
    for _ in range(2):
        waiting(site.api, site.owner_engine)
    return "/ui/bulk?action=cancel&status=WAITING"


def _bulk_preview_refused(site: Site) -> str:
    """A time it cannot use, said beside its field; a name it does not take, said above."""
    waiting(site.api, site.owner_engine)
    return "/ui/bulk?action=cancel&status=WAITING&createdAfter=yesterday"


def _bulk_progress(site: Site) -> str:
    waiting(site.api, site.owner_engine)
    body = {"filter": {"status": "WAITING"}, "action": "cancel", "reason": "outage"}
    answer = site.api.post("/executions/bulk", body, scopes=["executions:cancel"])
    assert answer.status_code == 202, answer.get_data(as_text=True)
    return f"/ui/bulk/{answer.get_json()['bulkId']}"


def _reconcile_form(site: Site) -> str:
    """The decision page, with then/now and the correction form."""
    ran_out = deadline_passed(site.api, site.owner_engine, now="timed_out").execution_id
    _requires_reconciliation(site, ran_out)
    return f"/ui/executions/{ran_out}/reconcile"


def _reconcile_form_corrected(site: Site) -> str:
    """The decision page after a corrected retry that parked again: the request data as
    accepted beside the data now, and the corrections between them."""
    parked = deadline_passed(site.api, site.owner_engine, now="timed_out")
    _requires_reconciliation(site, parked.execution_id)
    correction = [
        {"path": "/machineId", "before": "m-1", "after": "m-1.eu-west.example.com"},
        {"path": "/power", "after": "graceful, then hard after 30 s"},
    ]
    with site.owner_engine.begin() as connection:
        # Held again by its execution at the revision after acceptance (2) and one
        # correction, as a corrected retry leaves it.
        connection.execute(
            text(
                "UPDATE request SET busy_execution_id = CAST(:id AS uuid), revision = 3,"
                " data = CAST(:data AS jsonb) WHERE id = CAST(:request AS uuid)"
            ),
            {
                "id": parked.execution_id,
                "request": parked.request_id,
                "data": json.dumps({c["path"][1:]: c["after"] for c in correction}),
            },
        )
        connection.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)"
                " SELECT org_id, 'RECONCILIATION_RESOLVED', request_id, id, 'alice',"
                " CAST(:detail AS jsonb) FROM execution WHERE id = CAST(:id AS uuid)"
            ),
            {
                "id": parked.execution_id,
                "detail": json.dumps(
                    {"decision": "retry", "reason": "wrong host", "correction": correction}
                ),
            },
        )
    return f"/ui/executions/{parked.execution_id}/reconcile"


def _search(site: Site) -> str:
    deadline_passed(site.api, site.owner_engine)
    return "/ui/executions?machineId=m-1&flowKey=decommission&status=FAILED"


def _bad_search(site: Site) -> str:
    return "/ui/executions?createdAfter=yesterday"


def _request(site: Site) -> str:
    return f"/ui/requests/{deadline_passed(site.api, site.owner_engine).request_id}"


def _flows(site: Site) -> str:
    completed(site.api, site.owner_engine)
    return "/ui/flows"


def _flow(site: Site) -> str:
    return f"/ui/flows/{completed(site.api, site.owner_engine).flow_id}"


def _machine(site: Site) -> str:
    deadline_passed(site.api, site.owner_engine)
    completed(site.api, site.owner_engine)
    return "/ui/machines/m-1"


OUTPUT = "".join(f"reinstall: step {n} of 300, {'disk ' * (n % 7)}ok\n" for n in range(300))


def _running_with_output(site: Site, command_id: str) -> None:
    with site.owner_engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE machine_command SET status = 'running', output = :output,"
                " output_received = :size, output_size = :size WHERE id = CAST(:id AS uuid)"
            ),
            {"id": command_id, "output": OUTPUT, "size": len(OUTPUT.encode())},
        )


def _waiting_with_output(site: Site) -> str:
    """A wait whose command runs and talks: the wait box shows its last 200 lines."""
    waits = waiting(site.api, site.owner_engine)
    _running_with_output(site, waits.command_id)
    return f"/ui/executions/{waits.execution_id}"


def _never_delivered(site: Site) -> str:
    """The deadline passed before any agent took the command: expired, never delivered."""
    gone = deadline_passed(site.api, site.owner_engine, now="expired")
    return f"/ui/executions/{gone.execution_id}"


def _machine_running(site: Site) -> str:
    """A machine with a command under way (its output, the page following it) and one
    still pending (its deliver-by time)."""
    _running_with_output(site, waiting(site.api, site.owner_engine).command_id)
    waiting(site.api, site.owner_engine, command_status="pending")
    return "/ui/machines/m-1"


def _machine_offline(site: Site) -> str:
    """A machine whose agent polled once, five minutes ago: offline."""
    waiting(site.api, site.owner_engine, command_status="pending")
    with site.owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO machine_agent (org_id, machine_id, last_seen_at)"
                " VALUES (:org, 'm-1', now() - interval '5 min')"
            ),
            {"org": ORG},
        )
    return "/ui/machines/m-1"


def _notices(site: Site) -> str:
    with site.owner_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO panel_notice (org_id, category, title, body, external_key)"
                " VALUES (:org, 'machine', 'Disk almost full on m-1', 'At 95% since 09:30.', 'n1')"
            ),
            {"org": ORG},
        )
    return "/ui/notices"


def _approvals(site: Site) -> str:
    return "/ui/approvals"


def _schedules(site: Site) -> str:
    return "/ui/schedules"


def _approvals_open(site: Site) -> str:
    """An open approval the signed-in person may decide: its approve/reject form shows."""
    asked = waiting(site.api, site.owner_engine, sub="carol")
    draft = ApprovalDraft(
        org_id=ORG,
        request_id=uuid.UUID(asked.request_id),
        execution_id=uuid.UUID(asked.execution_id),
        action_id="ok",
        external_key=f"{asked.execution_id}:ok",
        title="Reboot m-1 for the kernel update?",
        body="It has been up for 400 days; the window is tonight at 02:00 UTC.",
        subjects=["alice"],
        scope=None,
        deadline_seconds=3600,
        actor="carol",
    )
    with site.owner_engine.begin() as connection:
        open_approval(connection, draft)
    return "/ui/approvals"


def _schedules_listed(site: Site) -> str:
    """A paused cron schedule and an interval one, with their timing and firing state."""
    flow_id = publish_schedule_flow(site.api)
    paused = {"flowId": flow_id, "cron": "0 3 * * *", "timezone": "Europe/Madrid", "paused": True}
    assert put_schedule(site.api, "nightly-report", paused).status_code == 201
    often = {"flowId": flow_id, "everySeconds": 90, "data": {"report": "load"}}
    assert put_schedule(site.api, "load-every-90-seconds", often).status_code == 201
    return "/ui/schedules"


def _schedule_with_executions(site: Site) -> str:
    """A manual flow's schedule by key, run now twice: its page lists what it started."""
    reboot = {
        "key": "reboot",
        "trigger": "manual",
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [{"id": "go", "from": ["new"], "to": "done"}],
    }
    site.api.publish(reboot, scopes=EVERY_SCOPE)
    body = {
        "flow": "reboot",
        "transition": "go",
        "everySeconds": 3600,
        "data": {"machineId": "m-1"},
    }
    assert put_schedule(site.api, "hourly-reboot", body).status_code == 201
    for _ in range(2):
        ran = site.api.client().post(
            "/api/v1/schedules/hourly-reboot/runs", headers=site.api.headers(scopes=EVERY_SCOPE)
        )
        assert ran.status_code == 201, ran.get_data(as_text=True)
    return "/ui/schedules/hourly-reboot"


def _sign_in_link_used(site: Site) -> str:
    """A hosting panel's sign-in link opened a second time: the page says to ask again."""
    body = {"sub": "carol", "org": ORG, "scope": "requests:read", "next": "/ui/executions"}
    made = site.api.post("/auth/links", body, scopes=["auth:link", "requests:read"])
    assert made.status_code == 201, made.get_data(as_text=True)
    link = made.get_json()["url"]
    path = link[link.index("/ui/") :]
    assert site.api.client().get(path).status_code == 200  # the one use it had
    return path


def _reconciliation_required(site: Site) -> str:
    """Then the command was `sent`, now it has `timed_out`; a person must decide."""
    ran_out = deadline_passed(site.api, site.owner_engine, now="timed_out").execution_id
    _requires_reconciliation(site, ran_out)
    return f"/ui/executions/{ran_out}"


def _purged(site: Site) -> str:
    gone = deadline_passed(site.api, site.owner_engine, now="succeeded", purged=True)
    return f"/ui/executions/{gone.execution_id}"


def _completed(site: Site) -> str:
    return f"/ui/executions/{completed(site.api, site.owner_engine).execution_id}"


def _dry_run(site: Site) -> str:
    return f"/ui/executions/{dry_run(site.api, site.owner_engine)}"


def _cancelled(site: Site) -> str:
    """A wait cancelled while its agent had the command: the page says it was asked to stop."""
    waits = waiting(site.api, site.owner_engine).execution_id
    answer = site.api.post(
        f"/executions/{waits}/cancel", {"reason": "kept"}, scopes=["executions:cancel"]
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return f"/ui/executions/{waits}"


def _blocked_by_a_key(site: Site) -> str:
    """Two executions under a machine's key of limit 1: the second waits for the first."""
    flow = site.api.publish(
        {
            "key": "reboot",
            "trigger": "manual",
            "dataSchema": {"type": "object", "properties": {"machineId": {"type": "string"}}},
            "initialState": "new",
            "states": ["new", "done"],
            "transitions": [
                {
                    "id": "go",
                    "from": ["new"],
                    "actions": [],
                    "to": "done",
                    "concurrency": {"key": "/data/machineId", "limit": 1},
                }
            ],
        }
    )
    started = []
    for _ in range(2):
        request = site.api.create_request(flow["id"], {"machineId": "m-1"})
        answer = site.api.transition(request["id"], "go", request["revision"])
        assert answer.status_code == 202, answer.get_data(as_text=True)
        started.append(answer.get_json()["executionId"])
    with site.runtime_engine.connect() as connection:
        claimed = claim_round(connection, "page-quality", limit=10, lease_seconds=30)
    assert [str(c.execution_id) for c in claimed.claims] == started[:1]
    return f"/ui/executions/{started[1]}"


def _not_found(site: Site) -> str:
    return f"/ui/executions/{uuid.uuid4()}"


def _login(site: Site) -> str:
    return "/ui/login"


PAGES: list[PageCase] = [
    PageCase("login", _login, signed_in=False),
    PageCase("executions", _list),
    PageCase("executions-by-duration", _by_duration),
    PageCase("executions-dry-runs", _dry_runs),
    PageCase("executions-search-two", _search_finding_two),
    PageCase("executions-search-none", _search_finding_none),
    PageCase("execution-waiting", _waiting),
    PageCase("execution-cancel-form", _cancel_form),
    PageCase("execution-reconcile-form", _reconcile_form),
    PageCase("execution-reconcile-form-corrected", _reconcile_form_corrected),
    PageCase("executions-search", _search),
    PageCase("executions-bad-search", _bad_search),
    PageCase("request", _request),
    PageCase("flows", _flows),
    PageCase("flow", _flow),
    PageCase("machine", _machine),
    PageCase("machine-command-running", _machine_running),
    PageCase("machine-agent-offline", _machine_offline),
    PageCase("execution-waiting-output", _waiting_with_output),
    PageCase("execution-command-never-delivered", _never_delivered),
    PageCase("notices", _notices),
    PageCase("approvals", _approvals),
    PageCase("approvals-open", _approvals_open),
    PageCase("schedules", _schedules),
    PageCase("schedules-listed", _schedules_listed),
    PageCase("schedule-with-executions", _schedule_with_executions),
    PageCase("sign-in-link-used", _sign_in_link_used, signed_in=False),
    PageCase("bulk-preview", _bulk_preview),
    PageCase("bulk-preview-refused", _bulk_preview_refused),
    PageCase("bulk-progress", _bulk_progress),
    PageCase("execution-reconciliation-required", _reconciliation_required),
    PageCase("execution-command-purged", _purged),
    PageCase("execution-completed", _completed),
    PageCase("execution-dry-run", _dry_run),
    PageCase("execution-cancelled", _cancelled),
    PageCase("execution-blocked-by-a-key", _blocked_by_a_key),
    PageCase("not-found", _not_found),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = start_chromium()
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def site(database: Any, owner_engine: Engine, runtime_engine: Engine) -> Iterator[Site]:
    with running_api(database.runtime_dsn) as api, serving(api.app) as base:
        yield Site(api, base, owner_engine, runtime_engine)


@pytest.mark.parametrize("case", PAGES, ids=lambda case: case.name)
def test_the_page_meets_the_quality_bar(case: PageCase, browser: Any, site: Site) -> None:
    path = case.arrange(site)
    forget_every_cookie(browser)
    if case.signed_in:
        keep_session(browser, site.base, site.api.token(scopes=EVERY_SCOPE))
    check_page(browser, case.name, site.base + path)
    if case.signed_in:  # checked as the person sees it, not as the sign-in page
        assert not browser.current_url.startswith(f"{site.base}/ui/login"), browser.current_url


SHORT_OF_THE_BAR = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Short of the bar</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/short.css"><script>document.title = "ran";</script></head>
<body><main><h1>Short of the bar</h1>
<form><input name="nameless"><button type="submit">Go</button></form>
<p><a href="/elsewhere" tabindex="-1">skipped by the keyboard</a></p>
<p class="faint">too faint to read</p>
<pre class="wide">a line far too long for a phone, kept on one line by white-space: pre</pre>
</main></body></html>"""

SHORT_CSS = ".faint { color: #c8c8c8; } .wide { width: 700px; }"


def test_the_checks_catch_a_page_that_falls_short(browser: Any) -> None:
    """The bar's own check: a page with one fault of each kind fails with each one named."""
    from flask import Flask, Response

    app = Flask(__name__)

    @app.get("/short")
    def short() -> Response:
        page = Response(SHORT_OF_THE_BAR, mimetype="text/html")
        page.headers["Content-Security-Policy"] = "default-src 'none'; style-src 'self'"
        return page

    @app.get("/short.css")
    def short_css() -> Response:
        return Response(SHORT_CSS, mimetype="text/css")

    forget_every_cookie(browser)
    with serving(app) as base, pytest.raises(pytest.fail.Exception) as failed:
        check_page(browser, "self-check-short-of-the-bar", f"{base}/short")

    said = str(failed.value)
    assert "at 390 px: the page scrolls sideways" in said and "pre.wide" in said
    assert "at 1280 px: the page scrolls sideways" not in said
    assert (
        'a control has no accessible name (label, aria-label or text): <input name="nameless">'
        in said
    )
    assert 'the Tab key never reaches <a href="/elsewhere" tabindex="-1"> (tabindex -1)' in said
    assert said.count("the Tab key never reaches") == 2  # the input and button it does reach
    assert "the Content-Security-Policy refused something" in said
    assert "axe serious color-contrast" in said and ".faint" in said
    assert "axe critical label" in said
