"""Fixtures of the high-availability tests: processes that never outlive their test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts, each in its own group: all are killed at the end."""
    processes: list[subprocess.Popen] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
