"""A sign-in link clicked on another site, in a real Chromium: with a different person
signed in, the landing asks before it replaces them, and nothing changes until the
person presses the button on this server's page."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.browser.browser_support import serving, sign_in, start_chromium
from tests.integration.api_support import ORG, Api, running_api


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = start_chromium()
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def api(database: Any) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def other_site() -> Iterator[tuple[str, dict[str, str]]]:
    """A page on another site (localhost, not 127.0.0.1) that links to whatever is set."""
    page: dict[str, str] = {"link": ""}

    @Request.application
    def app(request: Request) -> Response:
        return Response(f'<a id="go" href="{page["link"]}">open</a>', mimetype="text/html")

    server = make_server("localhost", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_port}/", page
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _who(driver: Any, base: str) -> str:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/ui/executions")
    return driver.find_element(By.CSS_SELECTOR, ".who").text.split(" ", 1)[0]


def test_a_link_from_another_site_asks_before_replacing_the_signed_in_person(
    api: Api, browser: Any, other_site: tuple[str, dict[str, str]]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serving(api.app) as base:
        sign_in(browser, base, api.token(sub="bob", scopes=["requests:read"]))
        made = api.post(
            "/auth/links",
            {"sub": "mallory", "org": ORG, "scope": "requests:read"},
            sub="panel",
            scopes=["auth:link", "requests:read"],
        )
        url = made.get_json()["url"]
        page_url, page = other_site
        page["link"] = base + url[url.index("/ui/") :]
        browser.get(page_url)
        browser.find_element(By.ID, "go").click()

        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: "Continue as mallory" in d.page_source)
        assert "signed in as <strong>bob</strong>" in browser.page_source
        asking = browser.current_url
        assert _who(browser, base) == "bob"  # nothing replaced while it asks

        browser.get(asking)
        wait.until(lambda d: "Continue as mallory" in d.page_source)
        button = browser.find_element(By.CSS_SELECTOR, "main form button")
        button.click()
        wait.until(lambda d: d.current_url.startswith(f"{base}/ui/executions"))
        assert _who(browser, base) == "mallory"
