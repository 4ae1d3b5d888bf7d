"""Tests that need the machine to themselves in a parallel run (a latency bound, for one).

Under xdist every test holds a shared lock on the run's "room" while it runs; a test marked
``alone`` holds it exclusively, so no other worker runs a test meanwhile. Entering goes
through a "gate" first, which an ``alone`` test keeps while it waits for the room to empty:
the others cannot keep walking in and starve it.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MARK = "alone"


@contextmanager
def turn(folder: Path, *, alone: bool) -> Iterator[None]:
    """Hold the room (exclusively when ALONE) for as long as the block runs."""
    with (folder / "gate.lock").open("a") as gate, (folder / "room.lock").open("a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
