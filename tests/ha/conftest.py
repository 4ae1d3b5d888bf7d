"""Fixtures of the high-availability tests: processes that never outlive their test, and a
lone server of the test's own."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.ha.api_traffic import kill_groups
from tests.ha.replication import ReplicatedPair


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts, each in its own group: all are killed at the end."""
    processes: list[subprocess.Popen] = []
    try:
        yield processes
    finally:
        kill_groups(processes)


@pytest.fixture
def server() -> Iterator[ReplicatedPair]:
    """A primary with no standby, built with the binaries the pair builder finds."""
    pair = ReplicatedPair()
    try:
        pair.start(standby=False)
        yield pair
    finally:
        pair.stop()
