"""The quality bar every page meets in a real Chromium, at a desk's width and a phone's.

`check_page(driver, name, url)` loads the page at 1280 px and at 390 px and, at each:
keeps a full-page screenshot in test-artifacts/pages/ (with axe's findings beside it, as
JSON), then checks that the page does not scroll sideways, that every form control has an
accessible name, that the keyboard's Tab key reaches every control and link, that the
Content-Security-Policy refused nothing, and that axe-core finds no serious or critical
violation. It fails once, listing everything found at both widths.

axe-core is injected through WebDriver (`execute_script` runs over the DevTools
protocol, outside the page's Content-Security-Policy), so the product's policy stays as
strict as it is: the pages themselves carry no script.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.axe_support import AxeUnavailable, ensure_axe
from tests.browser.browser_support import ARTIFACTS, DESK, PHONE

PAGES = ARTIFACTS / "pages"
WIDTHS = (DESK, PHONE)
FAILING_IMPACTS = ("serious", "critical")
CONTROLS = "input:not([type=hidden]), select, textarea, button"
REACHABLE = f"a[href], {CONTROLS}, [tabindex]:not([tabindex^='-'])"
AXE_TIMEOUT_SECONDS = 30


@pytest.fixture(scope="session")
def axe_core() -> Path:
    """The pinned axe.min.js, installed at first use; skips the test, saying why, without it."""
    try:
        return ensure_axe()
    except AxeUnavailable as why:
        pytest.skip(f"no axe-core to check the pages with: {why}")


@functools.cache
def _axe_source() -> str:
    try:
        return ensure_axe().read_text(encoding="utf-8")
    except AxeUnavailable as why:
        pytest.skip(f"no axe-core to check the pages with: {why}")


def check_page(driver: Any, name: str, url: str) -> None:
    """Load `url` at each width and fail, listing every finding, unless the page passes.

    `name` names the artifacts: test-artifacts/pages/<name>-1280.png and -390.png.
    """
    findings: list[str] = []
    for width, height in WIDTHS:
        findings += [
            f"at {width} px: {found}" for found in _check_at(driver, name, url, width, height)
        ]
    if findings:
        pytest.fail(f"{name} ({url}) falls short:\n  " + "\n  ".join(findings), pytrace=False)


def _check_at(driver: Any, name: str, url: str, width: int, height: int) -> list[str]:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(width, height)
    # Scrollbars over the page, as on a phone: the page is laid out at the full width, and
    # a full-page screenshot (which drops the scrollbar) shows the layout that was checked.
    driver.execute_cdp_cmd("Emulation.setScrollbarsHidden", {"hidden": True})
    driver.get_log("browser")  # this page's console record starts here
    driver.get(url)
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    inner = driver.execute_script("return window.innerWidth")
    assert inner == width, f"the window is {inner} px wide inside, not {width}"
    return _findings(driver, name, width)


def _findings(driver: Any, name: str, width: int) -> list[str]:
    _screenshot(driver, PAGES / f"{name}-{width}.png")
    findings = _policy_refusals(driver)
    findings += _overflow(driver)
    findings += _unnamed_controls(driver)
    findings += _unreachable(driver)
    findings += _axe_violations(driver, PAGES / f"{name}-{width}.axe.json")
    return findings


def check_this_page(driver: Any, name: str) -> None:
    """The same checks on the page the browser shows now (the answer to a form it sent),
    at each width, without loading it again; fails once, listing everything found."""
    findings: list[str] = []
    for width, height in WIDTHS:
        driver.set_window_size(width, height)
        driver.execute_cdp_cmd("Emulation.setScrollbarsHidden", {"hidden": True})
        findings += [f"at {width} px: {found}" for found in _findings(driver, name, width)]
    driver.set_window_size(*DESK)
    if findings:
        pytest.fail(f"{name} falls short:\n  " + "\n  ".join(findings), pytrace=False)


def _screenshot(driver: Any, path: Path) -> None:
    """The whole page, beyond the window's height, without resizing the window."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def _policy_refusals(driver: Any) -> list[str]:
    return [
        f"the Content-Security-Policy refused something: {entry['message']}"
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Refused" in entry["message"]
    ]


# What sticks out past the right edge, deepest first: the elements to fix.
_OVERFLOW = """
const edge = document.documentElement.clientWidth;
if (document.documentElement.scrollWidth <= edge) return [];
const out = [...document.body.querySelectorAll('*')].filter(
  el => el.getBoundingClientRect().right > edge + 0.5);
const deepest = out.filter(el => !out.some(other => other !== el && el.contains(other)));
return [document.documentElement.scrollWidth, edge, deepest.slice(0, 5).map(el =>
  el.tagName.toLowerCase() + (el.className ? '.' + [...el.classList].join('.') : '')
  + ' (right edge at ' + Math.round(el.getBoundingClientRect().right) + ' px)')];
"""


def _overflow(driver: Any) -> list[str]:
    found = driver.execute_script(_OVERFLOW)
    if not found:
        return []
    scrolled, edge, culprits = found
    return [
        f"the page scrolls sideways: {scrolled} px of content in {edge} px;"
        f" sticking out: {', '.join(culprits) or 'nothing visible'}"
    ]


def _describe(driver: Any, element: Any) -> str:
    return driver.execute_script(
        "const el = arguments[0];"
        "return el.outerHTML.slice(0, el.outerHTML.indexOf('>') + 1).slice(0, 120);",
        element,
    )


def _unnamed_controls(driver: Any) -> list[str]:
    """Chromium's own accessible name of each control: a label, aria-label or its text."""
    from selenium.webdriver.common.by import By

    return [
        f"a control has no accessible name (label, aria-label or text): {_describe(driver, c)}"
        for c in driver.find_elements(By.CSS_SELECTOR, CONTROLS)
        if c.is_displayed() and not (c.accessible_name or "").strip()
    ]


# The controls and links a person sees, each marked with its place; a focus listener
# writes down every one the Tab key lands on.
_LISTEN = """
const seen = [...document.querySelectorAll(arguments[0])].filter(el => {
  const style = getComputedStyle(el);
  return el.getClientRects().length > 0 && style.visibility !== 'hidden' && !el.disabled;
});
seen.forEach((el, at) => el.setAttribute('data-quality-place', String(at)));
window.__qualityFocused = [];
document.addEventListener('focusin', event => {
  const place = event.target.getAttribute && event.target.getAttribute('data-quality-place');
  if (place !== null) window.__qualityFocused.push(Number(place));
}, true);
if (document.activeElement && document.activeElement !== document.body) {
  document.activeElement.blur();
}
return seen.length;
"""

_NOT_REACHED = r"""
const reached = new Set(window.__qualityFocused);
return [...document.querySelectorAll('[data-quality-place]')]
  .filter(el => !reached.has(Number(el.getAttribute('data-quality-place'))))
  .map(el => {
    const why = el.tabIndex < 0 ? ' (tabindex ' + el.getAttribute('tabindex') + ')'
      : el.closest('[inert]') ? ' (inside an inert element)' : '';
    const tag = el.outerHTML.slice(0, el.outerHTML.indexOf('>') + 1);
    return tag.replace(/ data-quality-place="\d+"/, '').slice(0, 120) + why;
  });
"""


def _unreachable(driver: Any) -> list[str]:
    """Press Tab once more than there are controls and links, then name those not reached."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    count = driver.execute_script(_LISTEN, REACHABLE)
    if count:
        ActionChains(driver).send_keys(Keys.TAB * (count + 1)).perform()
    return [
        f"the Tab key never reaches {element}" for element in driver.execute_script(_NOT_REACHED)
    ]


_RUN_AXE = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(
  results => done(results.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
    targets: v.nodes.map(node => node.target.join(' ')),
    summary: v.nodes.length ? v.nodes[0].failureSummary : ''}))),
  failure => done({error: String(failure)}));
"""


def _axe_violations(driver: Any, report: Path) -> list[str]:
    """axe-core's violations; the serious and critical ones are findings, all are kept."""
    if not driver.execute_script("return typeof window.axe === 'object'"):
        driver.execute_script(_axe_source())
    driver.set_script_timeout(AXE_TIMEOUT_SECONDS)
    violations = driver.execute_async_script(_RUN_AXE)
    if isinstance(violations, dict):
        return [f"axe-core could not run: {violations['error']}"]
    report.write_text(json.dumps(violations, indent=2) + "\n", encoding="utf-8")
    return [
        f"axe {v['impact']} {v['id']}: {v['help']} — {'; '.join(v['targets'][:6])}"
        f"{' …' if len(v['targets']) > 6 else ''}"
        for v in violations
        if v["impact"] in FAILING_IMPACTS
    ]
