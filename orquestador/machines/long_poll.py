"""An agent's long poll: the machine's next command, waiting a bounded time for one to arrive.

No transaction stays open while it waits: each look is one short transaction (claim the
oldest pending command or find none), and between looks the thread sleeps. With a bell
(one LISTEN per process, rung when a command is written for the machine) it sleeps
until the bell rings, looking again at least every BELL_FALLBACK_SECONDS; without one,
or while the bell is not listening, it looks every POLL_SECONDS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from orquestador.machines.bell import CommandBell
from orquestador.machines.commands import AgentCommand, claim_next

# How long an empty look waits before the next one: the worst delay between a command's
# creation and its agent getting it, against one indexed query per waiting agent.
POLL_SECONDS = 0.25
# With the bell listening a look is needed only if a notification was lost.
BELL_FALLBACK_SECONDS = 5.0
MAX_WAIT_SECONDS = 30.0


def next_command(
    engine: Engine,
    *,
    org_id: str,
    machine_id: str,
    wait_seconds: float,
    credential_id: str | None = None,
    bell: CommandBell | None = None,
    stop: threading.Event | None = None,
    poll_seconds: float = POLL_SECONDS,
    bell_fallback_seconds: float = BELL_FALLBACK_SECONDS,
    on_empty_look: Callable[[], None] | None = None,
) -> AgentCommand | None:
    """The machine's oldest pending command, marked sent; None after `wait_seconds` with none.

    `stop` ends the wait early (the server is shutting down, or a newer poll of the machine
    replaced this one, or the machine's credentials were revoked); set before a look, no
    look follows. `credential_id` (the token's `jti`) is checked by every look's claim.
    `on_empty_look` is called after each look that found nothing, before sleeping (tests
    synchronise on it).
    """
    if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        raise ValueError(f"wait_seconds must be between 0 and {MAX_WAIT_SECONDS:g}")
    give_up_at = time.monotonic() + wait_seconds

    def look() -> AgentCommand | None:
        with engine.begin() as conn:
            return claim_next(
                conn, org_id=org_id, machine_id=machine_id, credential_id=credential_id
            )

    if bell is None or wait_seconds == 0:
        pause = stop or threading.Event()
        while True:
            command = look()
            if command is not None:
                return command
            if on_empty_look is not None:
                on_empty_look()
            left = give_up_at - time.monotonic()
            if left <= 0 or pause.wait(min(poll_seconds, left)):
                return None
    # Subscribed before the first look, so a command written after it rings the bell.
    with bell.subscription(org_id, machine_id) as rung:
        while True:
            rung.clear()
            # Checked before looking: a poll that was ended takes no command for an
            # agent that has moved on to a newer poll.
            if stop is not None and stop.is_set():
                return None
            command = look()
            if command is not None:
                return command
            if on_empty_look is not None:
                on_empty_look()
            left = give_up_at - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return None
            interval = bell_fallback_seconds if bell.listening.is_set() else poll_seconds
            rung.wait(min(interval, left))
