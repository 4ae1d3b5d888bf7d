"""axe-core for the page checks: one pinned version from the npm registry, kept out of git.

The package lands in `.test-tools/` at the top of the checkout (git ignores it). `.ci/run`
installs it before the tests (`python3 tests/browser/axe_support.py`); a plain `pytest`
on a fresh machine installs it at first use, one pytest-xdist worker at a time under a
file lock. Without npm and without the file the browser tests are skipped, with why.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

AXE_VERSION = "4.14.1"
TOOLS = Path(__file__).resolve().parents[2] / ".test-tools"
PACKAGE = TOOLS / "node_modules" / "axe-core"
SCRIPT = PACKAGE / "axe.min.js"
INSTALL_TIMEOUT_SECONDS = 300


class AxeUnavailable(Exception):
    """axe-core is not installed and could not be installed."""


def _installed_version() -> str | None:
    try:
        manifest = json.loads((PACKAGE / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest.get("version") if SCRIPT.is_file() else None


def npm_install_command() -> list[str]:
    """What installs the pinned axe-core into TOOLS, without a package.json to change."""
    return [
        "npm",
        "install",
        "--no-save",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--prefix",
        str(TOOLS),
        f"axe-core@{AXE_VERSION}",
    ]


def ensure_axe() -> Path:
    """The path of the pinned axe.min.js, installed with npm when missing or another version.

    Raises AxeUnavailable, saying why, when it is missing and npm cannot install it.
    """
    if _installed_version() == AXE_VERSION:
        return SCRIPT
    TOOLS.mkdir(exist_ok=True)
    # Parallel workers of one run: the first installs, the others wait and find it there.
    with (TOOLS / "install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _installed_version() == AXE_VERSION:
                return SCRIPT
            if shutil.which("npm") is None:
                raise AxeUnavailable(
                    f"axe-core {AXE_VERSION} is not in {TOOLS.name}/ and there is no npm to"
                    f" install it with (install npm: the tests then fetch it themselves)"
                )
            try:
                done = subprocess.run(
                    npm_install_command(),
                    capture_output=True,
                    text=True,
                    timeout=INSTALL_TIMEOUT_SECONDS,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise AxeUnavailable(
                    f"npm did not install axe-core {AXE_VERSION} within"
                    f" {INSTALL_TIMEOUT_SECONDS} s (is the npm registry reachable?)"
                ) from None
            if done.returncode != 0 or _installed_version() != AXE_VERSION:
                said = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise AxeUnavailable(
                    f"npm could not install axe-core {AXE_VERSION}: {' / '.join(said)}"
                )
            return SCRIPT
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    try:
        print(f"axe-core {AXE_VERSION}: {ensure_axe().relative_to(TOOLS.parent)}")
    except AxeUnavailable as why:
        print(f"axe-core: {why}; the browser tests will be skipped", file=sys.stderr)
        sys.exit(1)
