"""The bell of waiting long polls: one LISTEN per process, rung when a machine gets a command.

create_command notifies NEW_COMMAND_CHANNEL with the command's organization and machine
in the transaction that writes it. A long poll subscribes to its (organization, machine)
before it looks, and sleeps on its subscription between looks; the bell's thread sets it
when a notification for that machine arrives. The bell only shortens the sleep: a long
poll still looks at a bounded interval, so a lost notification or a dropped listener
connection delays a command, never loses it.

The thread runs while someone subscribes and ends when nobody has for a while, so an
idle process holds no connection for it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

log = logging.getLogger(__name__)

NEW_COMMAND_CHANNEL = "orquestador_command_pending"
# With nobody subscribed for this long the thread closes its connection and ends.
IDLE_SECONDS = 30.0
RECONNECT_SECONDS = 1.0

_Key = tuple[str, str]


def notification_payload(org_id: str, machine_id: str) -> str:
    # Both are bounded (a token's claims, the adapter's input schema): far below the
    # 8,000 bytes a notification may carry.
    return json.dumps([org_id, machine_id])


class CommandBell:
    """Per-machine events, set by one listening thread."""

    def __init__(self, conninfo: str, *, idle_seconds: float = IDLE_SECONDS) -> None:
        self._conninfo = conninfo
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._subscribers: dict[_Key, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()  # set while LISTEN is in effect

    @property
    def running(self) -> bool:
        """Whether the listening thread is up (it ends once nobody has subscribed for a while)."""
        with self._lock:
            return self._thread is not None

    @contextmanager
    def subscription(self, org_id: str, machine_id: str) -> Iterator[threading.Event]:
        """An event set whenever a command is written for the machine, while inside."""
        rung = threading.Event()
        key = (org_id, machine_id)
        with self._lock:
            self._subscribers.setdefault(key, set()).add(rung)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="orquestador-command-bell", daemon=True
                )
                self._thread.start()
        try:
            yield rung
        finally:
            with self._lock:
                waiting = self._subscribers.get(key)
                if waiting is not None:
                    waiting.discard(rung)
                    if not waiting:
                        del self._subscribers[key]

    def _ring(self, payload: str) -> None:
        try:
            org_id, machine_id = json.loads(payload)
        except (ValueError, TypeError):
            return
        with self._lock:
            for rung in self._subscribers.get((org_id, machine_id), ()):
                rung.set()

    def _idle(self) -> bool:
        """True, and the thread is forgotten, when nobody subscribes (checked under the lock)."""
        with self._lock:
            if self._subscribers:
                return False
            self._thread = None
            self.listening.clear()
            return True

    def _run(self) -> None:
        idle_for = 0.0
        while True:
            try:
                with psycopg.connect(
                    self._conninfo, autocommit=True, application_name="orquestador-command-bell"
                ) as conn:
                    conn.execute(f"LISTEN {NEW_COMMAND_CHANNEL}")
                    self.listening.set()
                    while True:
                        rang = False
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            self._ring(note.payload)
                            rang = True
                        with self._lock:
                            busy = bool(self._subscribers)
                        idle_for = 0.0 if busy or rang else idle_for + 1.0
                        if idle_for >= self._idle_seconds and self._idle():
                            return
            except Exception as exc:
                self.listening.clear()
                log.warning("command bell disconnected: %s", type(exc).__name__)
                threading.Event().wait(RECONNECT_SECONDS)
                if self._idle():
                    return


_BELLS: dict[tuple[int, str], CommandBell] = {}
_BELLS_LOCK = threading.Lock()


def bell_for(conninfo: str) -> CommandBell:
    """This process's bell for a database; keyed by process, since threads do not cross a fork."""
    key = (os.getpid(), conninfo)
    with _BELLS_LOCK:
        bell = _BELLS.get(key)
        if bell is None:
            bell = _BELLS[key] = CommandBell(conninfo)
        return bell
