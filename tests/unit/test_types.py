"""The protocol's packages (domain, queue, worker) pass mypy --strict, as configured in
pyproject.toml: a raiser typed NoReturn, a row's type, a keyword where two parameters
share a type are checked on every run of the suite, not by review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_protocol_packages_pass_the_strict_type_check() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
