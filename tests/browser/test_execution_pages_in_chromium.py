"""The execution pages in a real headless Chromium: sign in, the list, the reconciliation
queue, a wait that ran out (then `sent`, now `timed_out`), a purged command, sign out.

Each page's visible text is asserted and a screenshot of it saved to test-artifacts/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.browser.browser_support import (
    DESK,
    PHONE,
    forget_every_cookie,
    screenshot,
    serving,
    start_chromium,
)
from tests.integration.api_support import OTHER_ORG, Api, running_api
from tests.integration.execution_page_support import (
    completed,
    deadline_passed,
    dry_run,
    fixed_destination,
    waiting,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = start_chromium()
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def site(database, browser) -> Iterator[tuple[Api, str]]:
    forget_every_cookie(browser)
    browser.set_window_size(*DESK)
    with running_api(database.runtime_dsn) as api, serving(api.app) as base:
        yield api, base


def _by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def _all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _text(driver: Any) -> str:
    return _by_css(driver, "body").text


def _navigates(driver: Any, click: Any) -> None:
    """Click, then wait until the browser has loaded the page that click led to."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    old = _by_css(driver, "html")

    def replaced(_: Any) -> bool:
        # The old page's root is gone once the new page loads. Chromium reports a node of
        # an unloaded document either as stale or as "does not belong to the document".
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    click()
    wait = WebDriverWait(driver, 20)
    wait.until(replaced)
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")


def _sign_in(driver: Any, token: str) -> None:
    field = _by_css(driver, "input[name=token]")
    field.clear()
    field.send_keys(token)
    _navigates(driver, _by_css(driver, "form.login button[type=submit]").click)


def _policy_violations(driver: Any) -> list[str]:
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Refused" in entry["message"]
    ]


def test_a_person_signs_in_finds_the_queue_and_reads_then_beside_now(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    api, base = site
    ran_out = deadline_passed(api, owner_engine, now="timed_out")
    purged = deadline_passed(api, owner_engine, now="succeeded", purged=True)
    parked = completed(api, owner_engine)
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'RECONCILIATION_REQUIRED' WHERE id = %s",
            (parked.execution_id,),
        )
    browser.get_log("browser")  # start the console record from here

    # Not signed in: the list sends the person to the sign-in page.
    browser.get(f"{base}/ui/executions")
    assert browser.current_url.startswith(f"{base}/ui/login")
    assert "Paste an API token" in _text(browser)
    screenshot(browser, "login")

    _sign_in(browser, api.token())
    assert browser.current_url == f"{base}/ui/executions"
    listing = _text(browser)
    assert "Executions" in listing and "Reconciliation queue" in listing
    # Each arrangement published the flow again: versions 1 to 3, newest first.
    assert re.findall(r"decommission v(\d+) · power-off", listing) == ["3", "2", "1"]
    # The cookie is HttpOnly: no script on the page could read it.
    assert browser.execute_script("return document.cookie") == ""
    # The stylesheet loaded under the policy: the header bar has its dark background.
    bar = _by_css(browser, "header.bar").value_of_css_property("background-color")
    assert bar in ("rgba(27, 31, 36, 1)", "rgb(27, 31, 36)")
    screenshot(browser, "list")

    _navigates(
        browser,
        _by_css(browser, "nav.filters").find_element("link text", "Reconciliation queue").click,
    )
    assert browser.current_url.endswith("status=RECONCILIATION_REQUIRED")
    queue_links = [a.get_attribute("href") for a in _all_css(browser, "ul.executions a.title")]
    assert queue_links == [f"{base}/ui/executions/{parked.execution_id}"]
    assert "RECONCILIATION_REQUIRED" in _text(browser)
    screenshot(browser, "reconciliation-queue")

    browser.get(f"{base}/ui/executions/{ran_out.execution_id}")
    page = _text(browser)
    assert "FAILED" in page and "WAIT_DEADLINE_EXCEEDED" in page
    assert "The step wait failed (WAIT_DEADLINE_EXCEEDED); its error exit chose" in page
    assert "attention" in _by_css(browser, "section.decision").text
    then = _by_css(browser, ".then")
    now = _by_css(browser, ".now")
    assert "Then, when the flow decided" in then.text
    assert _by_css(then, ".command-status").text == "sent"
    assert ran_out.command_id in then.text
    assert _by_css(now, ".command-status").text == "timed_out"
    screenshot(browser, "execution-deadline-then-sent-now-timed-out")

    browser.get(f"{base}/ui/executions/{purged.execution_id}")
    now = _by_css(browser, ".now")
    assert "The command is no longer in the records." in now.text
    assert "sent" not in now.text and "succeeded" not in now.text
    assert _by_css(browser, ".then .command-status").text == "sent"
    screenshot(browser, "execution-command-purged")

    assert _policy_violations(browser) == []

    _navigates(browser, _by_css(browser, "form.signout button").click)
    assert browser.current_url == f"{base}/ui/login"
    browser.get(f"{base}/ui/executions/{ran_out.execution_id}")
    assert browser.current_url.startswith(f"{base}/ui/login")


def test_a_refused_token_shows_why_and_keeps_no_session(
    site: tuple[Api, str], browser: Any
) -> None:
    _, base = site
    browser.get(f"{base}/ui/login")

    _sign_in(browser, "this-is-not-a-token")

    assert "That token was not accepted: it is invalid or has expired." in _text(browser)
    assert browser.get_cookies() == []
    screenshot(browser, "login-refused")


def test_the_execution_page_fits_a_phone(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    api, base = site
    ran_out = deadline_passed(api, owner_engine, now="timed_out")
    browser.get(f"{base}/ui/login")
    _sign_in(browser, api.token())
    browser.set_window_size(*PHONE)

    browser.get(f"{base}/ui/executions/{ran_out.execution_id}")

    width = browser.execute_script("return document.documentElement.clientWidth")
    scrolled = browser.execute_script("return document.documentElement.scrollWidth")
    assert scrolled <= width, "the page scrolls sideways on a phone"
    then = _by_css(browser, ".then").rect
    now = _by_css(browser, ".now").rect
    assert now["y"] >= then["y"] + then["height"], "then and now stack on a narrow screen"
    assert "no longer in the records" not in _text(browser)
    screenshot(browser, "execution-on-a-phone")


def test_a_dry_run_reads_would_have_done_and_sits_under_dry_runs(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    api, base = site
    simulated = dry_run(api, owner_engine)
    browser.get(f"{base}/ui/login")
    _sign_in(browser, api.token())
    assert "No executions here." in _text(browser)

    _navigates(browser, _by_css(browser, "nav.filters").find_element("link text", "Dry runs").click)
    links = [a.get_attribute("href") for a in _all_css(browser, "ul.executions a.title")]
    assert links == [f"{base}/ui/executions/{simulated}"]
    screenshot(browser, "dry-runs")

    browser.get(links[0])
    section = _by_css(browser, "section.dry-run")
    assert "Nothing was sent to a machine" in section.text
    assert "Would have done" in section.text
    assert "send (machine.command, IDEMPOTENT_WRITE): send poweroff to machine m-1" in section.text
    screenshot(browser, "execution-dry-run")


def test_a_wait_reads_what_it_waits_for_then_stops_in_words_and_a_short_id_finds_it(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    api, base = site
    waits = waiting(api, owner_engine)
    fixed = fixed_destination(api, owner_engine)
    foreign = completed(api, owner_engine, org=OTHER_ORG)
    browser.get(f"{base}/ui/login")
    _sign_in(browser, api.token())

    # The search field takes a short id and opens that execution's page.
    field = _by_css(browser, "form.search input[name=id]")
    field.send_keys(waits.execution_id[:8])
    _navigates(browser, _by_css(browser, "form.search button[type=submit]").click)
    assert browser.current_url == f"{base}/ui/executions/{waits.execution_id}"
    block = _by_css(browser, ".waiting-for")
    assert "command poweroff --grace 30 on machine m-1" in block.text
    assert _by_css(block, ".command-status").text == "sent"
    assert re.fullmatch(r"([1-9]|1[0-9]|2[0-2]) s", _by_css(block, ".time-left").text)
    # Started is the wait's first round, 8 s before its latest.
    with owner_engine.connect() as connection:
        first = connection.exec_driver_sql(
            "SELECT to_char(first_started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
            " FROM action_execution WHERE execution_id = %s",
            (waits.execution_id,),
        ).scalar_one()
    assert f"Started\n{first} UTC" in _by_css(browser, "article.step").text
    screenshot(browser, "execution-waiting-for-a-command")

    cancelled = api.post(
        f"/executions/{waits.execution_id}/cancel",
        {"reason": "the customer stayed"},
        scopes=["executions:cancel"],
    )
    assert cancelled.status_code == 200, cancelled.get_data(as_text=True)
    browser.refresh()
    page = _text(browser)
    assert "NOT_READY" not in page and "Not decided yet" not in page
    assert "STOPPED" in page and "Cancelled before anything was decided." in page
    # The command its agent had taken is asked to stop, and the page says so.
    said = _by_css(browser, "section.cancel-commands").text
    assert "poweroff on m-1: already taken; its agent was asked to stop it." in said
    screenshot(browser, "execution-cancelled-wait")

    browser.get(f"{base}/ui/executions/{fixed}")
    page = _text(browser)
    assert "fixed destination" in page
    assert "Matched rules" not in page and "Nothing to look up" not in page
    screenshot(browser, "execution-fixed-destination")

    # Another organization's short id finds nothing, as if it did not exist.
    browser.get(f"{base}/ui/executions")
    _by_css(browser, "form.search input[name=id]").send_keys(foreign.execution_id[:8])
    _navigates(browser, _by_css(browser, "form.search button[type=submit]").click)
    assert "No execution you may see has an id starting with" in _text(browser)
    assert _all_css(browser, "ul.executions a.title") == []
    browser.set_window_size(*PHONE)
    width = browser.execute_script("return document.documentElement.clientWidth")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= width
    screenshot(browser, "search-on-a-phone")
    assert _policy_violations(browser) == []


def test_the_list_reads_as_a_table_on_a_desk_sorts_by_duration_and_keeps_cards_on_a_phone(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    from tests.browser.browser_support import sign_in

    api, base = site
    quick = completed(api, owner_engine, sub="bob")
    slow = completed(api, owner_engine)
    with owner_engine.begin() as connection:
        for arranged, seconds in ((quick, 3), (slow, 125)):
            connection.exec_driver_sql(
                "UPDATE execution SET started_at = now() - make_interval(secs => %s),"
                " finished_at = now() WHERE id = %s",
                (seconds + 1, arranged.execution_id),
            )
    sign_in(browser, base, api.token(scopes=["requests:read", "requests:read-all"]))

    browser.set_window_size(*DESK)
    browser.get(f"{base}/ui/executions")
    table = _by_css(browser, "table.execution-table")
    assert table.is_displayed() and not _by_css(browser, "ul.executions").is_displayed()
    headers = [th.text for th in _all_css(browser, "table.execution-table th")]
    assert headers == [
        "Status", "Flow and transition", "Machine", "Started", "Duration", "Attempts",
        "Started by",
    ]  # fmt: skip
    # Newest first: the slow one was arranged last.
    rows = [row.text for row in _all_css(browser, "table.execution-table tbody tr")]
    assert "2 min 6 s" in rows[0] and "alice" in rows[0] and "bob" in rows[1]
    _navigates(browser, _by_css(browser, "th a[href*='sort=duration']").click)
    assert "sort=duration" in browser.current_url
    rows = [row.text for row in _all_css(browser, "table.execution-table tbody tr")]
    assert ["2 min 6 s" in rows[0], "4 s" in rows[1]] == [True, True]
    assert _by_css(browser, "th[aria-sort=descending]").text == "Duration"
    screenshot(browser, "list-table-by-duration")

    browser.set_window_size(*PHONE)
    browser.get(f"{base}/ui/executions")
    assert not _by_css(browser, "table.execution-table").is_displayed()
    assert _by_css(browser, "ul.executions").is_displayed()
    screenshot(browser, "list-cards-on-a-phone")
