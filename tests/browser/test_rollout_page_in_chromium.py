"""An operator steers a rollout from its execution's page in a real Chromium: pause, resume
and cancel it, then retry the failed children of another; the page meets the quality bar."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.worker.executor import Executor
from orquestador.worker.hooks import WorkerHooks
from tests.browser.browser_support import DESK, serving, sign_in, start_chromium
from tests.browser.page_quality import (
    axe_core,  # noqa: F401 (the fixture: installs axe-core, or skips saying why)
    check_this_page,
)
from tests.integration.api_support import running_api
from tests.integration.rollout_support import PatchProvider, children, rollout_registry
from tests.integration.test_ui_rollouts import OPERATOR, start
from tests.integration.worker_support import audit, execution, run_once, settings

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


def _click(driver: Any, words: str, reason: str | None = None) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.CSS_SELECTOR, "html")
    if reason is not None:
        driver.find_element(By.ID, "rollout-cancel-reason").send_keys(reason)
    button = driver.find_element(
        By.XPATH, f"//section[@class='rollout']//button[normalize-space()='{words}']"
    )
    button.click()
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "html") != old)


def test_an_operator_pauses_resumes_cancels_and_retries_from_the_page(
    database: Any, browser: Any, runtime_engine: Engine
) -> None:
    from selenium.webdriver.common.by import By

    provider = PatchProvider(seconds=0.0, failing=frozenset({"m-1"}))
    registry = rollout_registry(database, provider)
    executor = Executor(registry, settings(database_url=database.runtime_dsn), WorkerHooks())
    with running_api(database.runtime_dsn, registry=registry) as api, serving(api.app) as base:
        steered = start(api, ["m-0", "m-1", "m-2", "m-3"], batch=1, maxFailures=0)
        assert run_once(runtime_engine, executor) == "WAITING"
        sign_in(browser, base, api.token(scopes=OPERATOR))
        browser.get(f"{base}/ui/executions/{steered}")
        check_this_page(browser, "rollout")

        _click(browser, "Pause the rollout")
        assert "?done=rollout-pause" in browser.current_url
        assert (
            "no child starts until it resumes"
            in browser.find_element(By.CSS_SELECTOR, ".done").text
        )
        _click(browser, "Resume the rollout")
        assert "?done=rollout-resume" in browser.current_url
        _click(browser, "Cancel the rollout", reason="wrong kernel")
        assert "?done=rollout-cancel" in browser.current_url
        (cancelled,) = audit(runtime_engine, uuid.UUID(steered), "ROLLOUT_CANCELLED")
        assert (cancelled.actor, cancelled.detail["reason"]) == ("alice", "wrong kernel")
        assert [
            row.kind
            for row in audit(runtime_engine, uuid.UUID(steered))
            if row.kind in ("ROLLOUT_PAUSED", "ROLLOUT_RESUMED")
        ] == ["ROLLOUT_PAUSED", "ROLLOUT_RESUMED"]
        assert run_once(runtime_engine, executor) == "FAILED"  # nothing runs: the step ends
        assert execution(runtime_engine, uuid.UUID(steered)).error_code == "ROLLOUT_CANCELLED"

        failed = start(api, ["m-0", "m-1"], batch=2, maxFailures=1)
        for _ in range(4):
            run_once(runtime_engine, executor)  # the parent, both children, the parent
        assert execution(runtime_engine, uuid.UUID(failed)).status == "SUCCEEDED"
        provider.failing = frozenset()
        browser.get(f"{base}/ui/executions/{failed}")
        _click(browser, "Retry the 1 failed children")
        assert "?done=rollout-retry-failed" in browser.current_url
        again = browser.current_url.split("?")[0].rsplit("/", 1)[-1]
        assert run_once(runtime_engine, executor) == "WAITING"
        assert [c.machine_id for c in children(runtime_engine, uuid.UUID(again))] == ["m-1"]
