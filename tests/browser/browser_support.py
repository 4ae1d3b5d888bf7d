"""A real headless Chromium for the page tests, and the app served over real HTTP.

The browser is Debian's `chromium` driven by its `chromium-driver` through selenium.
When either is missing or will not start, the tests are skipped with the reason in
the summary (`-ra`), so a run without a browser says so instead of passing quietly.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from flask import Flask
from werkzeug.serving import make_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL_HINT = "apt-get install -y chromium chromium-driver"

# Screenshots of every page the tests visit, for people to look at; git ignores them.
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

PHONE = (390, 844)
DESK = (1280, 900)


def browser_problem() -> str | None:
    """Why no browser can be had here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists() and shutil.which(path.name) is None:
            return f"{path} is missing: no real browser to check the pages with ({INSTALL_HINT})"
    return None


def start_chromium():  # type: ignore[no-untyped-def]
    """A headless Chromium; skips the test, with the reason, when it cannot start."""
    problem = browser_problem()
    if problem:
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium"))
    for argument in (
        "--headless=new",
        "--no-sandbox",  # containers run the tests as root, where the sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--window-size={DESK[0]},{DESK[1]}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if CHROMEDRIVER.exists() else Path(str(shutil.which("chromedriver")))
    try:
        return webdriver.Chrome(service=Service(str(driver_path)), options=options)
    except WebDriverException as failure:
        pytest.skip(f"Chromium would not start, so the pages were not checked: {failure.msg}")


@contextmanager
def serving(app: Flask) -> Iterator[str]:
    """The app on a real HTTP server on 127.0.0.1; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="ui-test-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def screenshot(driver, name: str) -> Path:  # type: ignore[no-untyped-def]
    """The whole page, not only what fits the window: the window grows for the shot."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    size = driver.get_window_size()
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(size["width"], max(size["height"], min(height + 160, 8000)))
    try:
        assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    finally:
        driver.set_window_size(size["width"], size["height"])
    return path


def forget_every_cookie(driver) -> None:  # type: ignore[no-untyped-def]
    """Every cookie of every site: WebDriver's own delete clears only the current page's
    site, and the current page may be an error page (a page that refreshes itself, once
    its test's server stopped), whose site has none."""
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})


def keep_session(driver, base: str, token: str) -> None:  # type: ignore[no-untyped-def]
    """The session cookie the sign-in form leaves (the token as pasted, for /ui only, never
    for scripts or another site's pages), set directly: for tests of what a signed-in
    person sees; the form itself is tested where signing in is the story."""
    driver.execute_cdp_cmd(
        "Network.setCookie",
        {
            "name": "orquestador_session",
            "value": token,
            "url": f"{base}/ui",
            "path": "/ui",
            "httpOnly": True,
            "sameSite": "Strict",
        },
    )


def sign_in(driver, base: str, token: str) -> None:  # type: ignore[no-untyped-def]
    """Through the sign-in form, as a person does; returns once the next page has loaded."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Leave the last page first: a page that refreshes itself (an execution or a bulk
    # action under way) can fire its refresh while the sign-in page is being loaded.
    driver.get("about:blank")
    driver.get(f"{base}/ui/login")
    WebDriverWait(driver, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "input[name=token]")
    )[0].send_keys(token)
    button = driver.find_element(By.CSS_SELECTOR, "form.login button[type=submit]")

    def left(_: object) -> bool:
        # Chromium reports a node of an unloaded page as stale or as not of the document.
        try:
            button.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as failure:
            if "does not belong to the document" in str(failure):
                return True
            raise
        return False

    button.click()
    wait = WebDriverWait(driver, 20)
    wait.until(left)
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
    assert not driver.current_url.startswith(f"{base}/ui/login"), "the sign-in was refused"
