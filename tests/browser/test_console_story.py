"""An operator's morning in a real Chromium: a checkout whose charge is in doubt is
found by search, retried with a correction from its decision page, and its page then
tells the whole story. The browser sends the forms itself (its Origin, the CSRF token).

The screenshots this takes are the ones docs/PAGES.md shows (test-artifacts/story/).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.worker.executor import Executor
from tests.browser.browser_support import ARTIFACTS, DESK, serving, sign_in, start_chromium
from tests.integration.api_support import Api, running_api
from tests.integration.correction_support import OPERATOR, charge_double, park
from tests.integration.worker_support import (
    execution,
    registry_of,
    request_row,
    run_once,
    settings,
)

STORY = ARTIFACTS / "story"


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = start_chromium()
    driver.set_page_load_timeout(30)
    driver.set_window_size(*DESK)
    driver.execute_cdp_cmd("Emulation.setScrollbarsHidden", {"hidden": True})
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str) -> None:
    """A full-page screenshot, as the page is laid out at the window's width."""
    STORY.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(DESK[0], max(DESK[1], height + 120))
    driver.save_screenshot(str(STORY / f"{name}.png"))
    driver.set_window_size(*DESK)


def _submit(driver: Any, form: Any) -> None:
    """Press the form's button, then wait for the page the answer leads to."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.CSS_SELECTOR, "html")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "html") != old)


def test_an_operator_finds_corrects_and_retries_a_charge_in_doubt(
    database: Any, browser: Any, runtime_engine: Engine
) -> None:
    from selenium.webdriver.common.by import By

    charge = charge_double({"chargeId": "ch_1"})
    registry = registry_of(charge)
    eid = park(runtime_engine, charge, key="checkout")
    with running_api(database.runtime_dsn, registry=registry) as api, serving(api.app) as base:
        api.app.extensions[ADAPTERS_EXTENSION] = registry
        _morning(api, base, browser, eid)
        # The worker takes the retry; the page tells the whole story.
        assert run_once(runtime_engine, Executor(registry, settings())) == "SUCCEEDED"
        browser.get(f"{base}/ui/executions/{eid}")
        words = browser.find_element(By.CSS_SELECTOR, "main").text
        _shot(browser, "execution")
    assert "operator-1 asked for a retry of step charge with a correction" in words
    assert "900 → 950" in words and "Completed: new → done" in words
    run = execution(runtime_engine, eid)
    assert request_row(runtime_engine, run.request_id).data["amount"] == 950
    first, retried = charge.calls
    assert (first.inputs["amount"], retried.inputs["amount"]) == (900, 950)
    assert retried.external_key == first.external_key


def _morning(api: Api, base: str, browser: Any, eid: Any) -> None:
    from selenium.webdriver.common.by import By

    sign_in(browser, base, api.token(**OPERATOR))
    # The search: the organization's checkouts waiting for a person.
    browser.get(f"{base}/ui/executions")
    browser.find_element(By.ID, "search-flow").send_keys("checkout")
    search = browser.find_element(By.CSS_SELECTOR, "form.search")
    search.find_element(
        By.CSS_SELECTOR, "select[name=status] option[value=RECONCILIATION_REQUIRED]"
    ).click()
    _submit(browser, search)
    assert "flowKey=checkout" in browser.current_url
    _shot(browser, "search")
    browser.find_element(By.PARTIAL_LINK_TEXT, "checkout").click()
    browser.find_element(By.LINK_TEXT, "Decide what happened").click()
    # The decision page: then, now and the data beside the correction.
    form = browser.find_element(By.CSS_SELECTOR, "form:has(input[value=retry])")
    form.find_element(By.ID, "path1").send_keys("/amount")
    form.find_element(By.ID, "value1").send_keys("950")
    form.find_element(By.ID, "retry-reason").send_keys(
        "The provider refused 900; the customer confirmed 950 by phone."
    )
    _shot(browser, "reconcile-with-a-correction")
    _submit(browser, form)
    assert browser.current_url.endswith(f"/ui/executions/{eid}?done=reconciled-retry")
    assert "The step runs again" in browser.find_element(By.CSS_SELECTOR, ".done").text
