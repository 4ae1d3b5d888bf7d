"""A newcomer starts a reboot from the flow page in a real Chromium: a refusal shows the form
again, as typed, with the problem next to its field (and meets the pages' quality bar),
then the corrected form starts the run and lands on its page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.browser.browser_support import DESK, serving, sign_in, start_chromium
from tests.browser.page_quality import (
    axe_core,  # noqa: F401 (the fixture: installs axe-core, or skips saying why)
    check_this_page,
)
from tests.integration.api_support import running_api
from tests.integration.test_ui_start_form import REBOOT_SCHEMA, STARTER
from tests.integration.worker_support import execution, request_row

pytestmark = pytest.mark.usefixtures("axe_core")


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = start_chromium()
    driver.set_page_load_timeout(30)
    driver.set_window_size(*DESK)
    try:
        yield driver
    finally:
        driver.quit()


def _submit(driver: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.CSS_SELECTOR, "html")
    form = driver.find_element(By.CSS_SELECTOR, "section.start-form form")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "html") != old)


def test_a_reboot_is_started_from_the_flow_page_after_one_refusal(
    database: Any, browser: Any, runtime_engine: Engine
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with running_api(database.runtime_dsn) as api, serving(api.app) as base:
        from tests.integration.api_support import decommission

        flow = api.publish(decommission(key="reboot-host", dataSchema=REBOOT_SCHEMA))
        sign_in(browser, base, api.token(scopes=STARTER))
        browser.get(f"{base}/ui/flows/{flow['id']}")
        browser.find_element(By.ID, "start-field-machineId").send_keys("m-1")
        browser.find_element(By.ID, "start-field-reason").send_keys("no")
        Select(browser.find_element(By.ID, "start-field-mode")).select_by_visible_text("hard")
        _submit(browser)

        reason = browser.find_element(By.ID, "start-field-reason")
        assert reason.get_attribute("value") == "no"
        assert reason.get_attribute("aria-invalid") == "true"
        problem = browser.find_element(By.ID, "start-field-reason-problem").text
        assert "too short" in problem
        assert browser.find_element(By.ID, "start-field-machineId").get_attribute("value") == "m-1"
        assert Select(
            browser.find_element(By.ID, "start-field-mode")
        ).first_selected_option.text == ("hard")
        check_this_page(browser, "flow-start-refused")

        reason = browser.find_element(By.ID, "start-field-reason")
        reason.clear()
        reason.send_keys("kernel update")
        _submit(browser)

        assert "?done=started" in browser.current_url
        assert "The run started" in browser.find_element(By.CSS_SELECTOR, ".done").text
        execution_id = browser.current_url.split("/")[-1].split("?")[0]
    started = execution(runtime_engine, execution_id)
    assert request_row(runtime_engine, started.request_id).data == {
        "machineId": "m-1",
        "reason": "kernel update",
        "mode": "hard",
        "notify": False,
    }
