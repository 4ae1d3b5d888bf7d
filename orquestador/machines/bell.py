"""The bell of waiting long polls: one LISTEN per process, rung when a machine gets a command.

create_command notifies NEW_COMMAND_CHANNEL with the command's organization and machine
in the transaction that writes it. A long poll subscribes to its (organization, machine)
before it looks, and sleeps on its subscription between looks; the bell's thread sets it
when a notification for that machine arrives. The bell only shortens the sleep: a long
poll still looks at a bounded interval, so a lost notification or a dropped listener
connection delays a command, never loses it.

The bell also keeps a machine to one open poll. A poll opened here ends this process's
older polls of its machine at once, and `announce_poll` tells the other processes through
POLL_OPENED_CHANNEL, whose bells end the polls of that machine announced before it (by
the database's clock, so that a late notification never ends a newer poll; a poll that
ended an older one here announces itself only once that one is over, so that the older
never announces after it). A process whose bell is not listening at that moment
(connecting, reconnecting), or a poll not yet announced when the notification arrives,
keeps its older poll until that poll's own wait ends. A revocation of the machine's
credentials is announced the same way (`announce_revocation`), so it ends the machine's
polls at once. `stop_polls` ends every poll of
the process when it shuts down; from then on a lost connection ends the thread quietly
(the database may stop first), where before it is a warning and a reconnect.

The thread runs while someone subscribes and ends when nobody has for a while, so an
idle process holds no connection for it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Connection, text

log = logging.getLogger(__name__)

NEW_COMMAND_CHANNEL = "orquestador_command_pending"
# Payload [organization, machine, poll id, microseconds since the epoch by the database's
# clock]: a poll of that machine has opened somewhere.
POLL_OPENED_CHANNEL = "orquestador_agent_poll_opened"
# With nobody subscribed for this long the thread closes its connection and ends.
IDLE_SECONDS = 30.0
RECONNECT_SECONDS = 1.0

_Key = tuple[str, str]


def notification_payload(org_id: str, machine_id: str) -> str:
    # Both are bounded (a token's claims, the adapter's input schema): far below the
    # 8,000 bytes a notification may carry.
    return json.dumps([org_id, machine_id])


@dataclass
class OpenPoll:
    """One agent long poll of this process, registered while it waits."""

    org_id: str
    machine_id: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Set when a newer poll of the machine, or the process's shutdown, ends this one.
    ended: threading.Event = field(default_factory=threading.Event)
    # Whether opening it ended an older poll of the machine in this process.
    replaced_older: bool = False
    # When it was announced, in microseconds by the database's clock; None before.
    announced_at: int | None = None
    # The machine's polls that were open here when this one opened, and whether this one
    # is over (set as it leaves `open_poll`, its announcement behind it if it made one).
    older: tuple[OpenPoll, ...] = ()
    over: threading.Event = field(default_factory=threading.Event)

    def wait_for_older(self, timeout: float) -> None:
        """Wait, at most `timeout` in all, until the older polls are over.

        An older poll may not have announced itself yet: announced after this one, by the
        database's clock it would be the newer, and its notification would end this one.
        """
        deadline = time.monotonic() + timeout
        for poll in self.older:
            poll.over.wait(max(0.0, deadline - time.monotonic()))


# The time is the database's, one clock for every process; it rides in the payload.
_ANNOUNCE = text(
    """
    WITH announced AS (
        SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS at
    )
    SELECT at, pg_notify(
        :channel,
        json_build_array(CAST(:org AS text), CAST(:machine AS text), CAST(:poll AS text), at)::text
    )
    FROM announced
    """
)


def announce_poll(conn: Connection, poll: OpenPoll) -> None:
    """Tell every process's bell that POLL is now its machine's poll (sent at commit)."""
    at = conn.execute(
        _ANNOUNCE,
        {
            "channel": POLL_OPENED_CHANNEL,
            "org": poll.org_id,
            "machine": poll.machine_id,
            "poll": poll.id,
        },
    ).scalar_one()
    poll.announced_at = int(at)


def announce_revocation(conn: Connection, *, org_id: str, machine_id: str) -> None:
    """End the machine's open polls in every process, once the revocation commits.

    Sent as a poll opened now with no id: every bell ends the machine's polls announced
    before it, and the agent's next poll is refused. A poll not yet announced (or in a
    process whose bell is not listening) waits on, but its claim refuses the revoked
    credential, so it hands out nothing.
    """
    conn.execute(
        _ANNOUNCE,
        {"channel": POLL_OPENED_CHANNEL, "org": org_id, "machine": machine_id, "poll": ""},
    )


class CommandBell:
    """Per-machine events, set by one listening thread."""

    def __init__(self, conninfo: str, *, idle_seconds: float = IDLE_SECONDS) -> None:
        self._conninfo = conninfo
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._subscribers: dict[_Key, set[threading.Event]] = {}
        self._polls: dict[_Key, dict[str, OpenPoll]] = {}
        self._stopping = False
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
            self._start_locked()
        try:
            yield rung
        finally:
            with self._lock:
                waiting = self._subscribers.get(key)
                if waiting is not None:
                    waiting.discard(rung)
                    if not waiting:
                        del self._subscribers[key]

    @contextmanager
    def open_poll(self, org_id: str, machine_id: str) -> Iterator[OpenPoll]:
        """The machine's poll in this process while inside; its older ones end at once."""
        key = (org_id, machine_id)
        with self._lock:
            older = tuple(self._polls.get(key, {}).values())
            replaced = self._end_locked(key)
            poll = OpenPoll(org_id, machine_id, replaced_older=replaced, older=older)
            if self._stopping:
                poll.ended.set()
            self._polls.setdefault(key, {})[poll.id] = poll
            # Listening, so that a newer poll in another process can end this one.
            self._start_locked()
        try:
            yield poll
        finally:
            with self._lock:
                open_polls = self._polls.get(key)
                if open_polls is not None:
                    open_polls.pop(poll.id, None)
                    if not open_polls:
                        del self._polls[key]
            poll.over.set()
            poll.older = ()  # each poll holding its predecessor would keep them all alive

    def stop_polls(self) -> None:
        """End every open poll, and any opened from now on (the process is stopping)."""
        with self._lock:
            self._stopping = True
            for key in list(self._polls):
                self._end_locked(key)

    def _end_locked(self, key: _Key, announced_before: int | None = None) -> bool:
        """End the machine's open polls (only those announced before, when given); True
        when there was one to end."""
        ended = False
        for poll in self._polls.get(key, {}).values():
            if announced_before is not None and not (
                poll.announced_at is not None and poll.announced_at < announced_before
            ):
                continue
            if not poll.ended.is_set():
                poll.ended.set()
                ended = True
        if ended:
            # The ended poll sleeps on its subscription: ringing it makes it look at
            # `ended` now rather than at its next fallback look.
            for rung in self._subscribers.get(key, ()):
                rung.set()
        return ended

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="orquestador-command-bell", daemon=True
            )
            self._thread.start()

    def _ring(self, payload: str) -> None:
        try:
            org_id, machine_id = json.loads(payload)
        except (ValueError, TypeError):
            return
        with self._lock:
            for rung in self._subscribers.get((org_id, machine_id), ()):
                rung.set()

    def _poll_opened(self, payload: str) -> None:
        try:
            org_id, machine_id, _, announced_at = json.loads(payload)
        except (ValueError, TypeError):
            return
        if not isinstance(announced_at, int):
            return
        with self._lock:
            self._end_locked((org_id, machine_id), announced_before=announced_at)

    def _idle(self) -> bool:
        """True, and the thread is forgotten, when nobody subscribes (checked under the lock)."""
        with self._lock:
            if self._subscribers or self._polls:
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
                    conn.execute(f"LISTEN {POLL_OPENED_CHANNEL}")
                    self.listening.set()
                    while True:
                        rang = False
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if note.channel == POLL_OPENED_CHANNEL:
                                self._poll_opened(note.payload)
                            else:
                                self._ring(note.payload)
                            rang = True
                        with self._lock:
                            busy = bool(self._subscribers or self._polls)
                        idle_for = 0.0 if busy or rang else idle_for + 1.0
                        if idle_for >= self._idle_seconds and self._idle():
                            return
            except Exception as exc:
                self.listening.clear()
                with self._lock:
                    if self._stopping:
                        # The process is stopping, and its database may go first (dev stops
                        # its embedded server): nothing is wrong, and nothing will listen.
                        self._thread = None
                        log.debug("command bell closed while stopping: %s", type(exc).__name__)
                        return
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


def stop_polls() -> None:
    """End the open polls of every bell of this process: it is shutting down."""
    with _BELLS_LOCK:
        bells = [bell for (pid, _), bell in _BELLS.items() if pid == os.getpid()]
    for bell in bells:
        bell.stop_polls()
