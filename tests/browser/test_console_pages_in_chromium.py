"""The console's read pages in a real headless Chromium: at 1280 px and at 390 px each
page fits without scrolling sideways, keeps its policy, and labels every control."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.browser.browser_support import DESK, PHONE, screenshot, serving, start_chromium
from tests.integration.api_support import ALL_SCOPES, Api, running_api
from tests.integration.execution_page_support import completed, deadline_passed

EVERY_SCOPE = [*ALL_SCOPES, "notices:read", "approvals:decide", "plans:admin"]

# A control is labelled by a <label for>, by wrapping, or by aria-label.
_UNLABELLED = """
return Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea'))
  .filter(c => !(c.labels && c.labels.length) && !c.getAttribute('aria-label'))
  .map(c => c.name || c.id);
"""


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
    browser.delete_all_cookies()
    browser.set_window_size(*DESK)
    with running_api(database.runtime_dsn) as api, serving(api.app) as base:
        yield api, base


def _sign_in(driver: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/ui/login")
    field = driver.find_element(By.CSS_SELECTOR, "input[name=token]")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form.login button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda d: "/ui/login" not in d.current_url)


def test_every_console_page_fits_a_desk_and_a_phone(
    site: tuple[Api, str], browser: Any, owner_engine: Engine
) -> None:
    api, base = site
    failed = deadline_passed(api, owner_engine)
    completed(api, owner_engine)
    _sign_in(browser, base, api.token(scopes=EVERY_SCOPE))
    browser.get_log("browser")  # start the console record from here
    pages = {
        "search": "/ui/executions?machineId=m-1&flowKey=decommission&status=FAILED",
        "bad-search": "/ui/executions?createdAfter=yesterday",
        "request": f"/ui/requests/{failed.request_id}",
        "flows": "/ui/flows",
        "flow": f"/ui/flows/{failed.flow_id}",
        "machine": "/ui/machines/m-1",
        "notices": "/ui/notices",
        "approvals": "/ui/approvals",
        "schedules": "/ui/schedules",
    }

    for size_name, size in (("desk", DESK), ("phone", PHONE)):
        browser.set_window_size(*size)
        for name, path in pages.items():
            browser.get(f"{base}{path}")
            width = browser.execute_script("return document.documentElement.clientWidth")
            scrolled = browser.execute_script("return document.documentElement.scrollWidth")
            assert scrolled <= width, f"{name} scrolls sideways at {size_name} size"
            assert browser.execute_script(_UNLABELLED) == [], name
            screenshot(browser, f"console-{name}-{size_name}")
    refused = [
        entry["message"]
        for entry in browser.get_log("browser")
        if "Content Security Policy" in entry["message"]
    ]
    assert refused == []
