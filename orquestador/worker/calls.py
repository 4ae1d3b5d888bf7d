"""Adapter calls on their own threads, so that a job stops waiting at the adapter's deadline.

Python cannot kill a thread. A call that overruns its timeout is abandoned, not
stopped: the job records the outcome as uncertain and moves on, the call's stop signal
is set, and whatever the call returns later is dropped (the job no longer listens,
and every write goes through the job anyway). What a non-cooperative adapter still
costs is its thread, until it returns by itself. Threads are daemons, so a call that
never returns cannot keep the process from exiting, and idle ones are reused.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

log = logging.getLogger(__name__)


class CallTimedOut(Exception):
    """The adapter did not return before its deadline; its outcome is unknown."""


_Work = tuple[Callable[[Any], Any], Any, "Future[Any]", dict[str, Any]]


class _CallThread(threading.Thread):
    def __init__(self, owner: AdapterCalls, number: int) -> None:
        super().__init__(name=f"orquestador-call-{number}", daemon=True)
        self.inbox: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._owner = owner

    def run(self) -> None:
        while True:
            work = self.inbox.get()
            if work is None:
                return
            function, argument, future, log_extra = work
            result: Any = None
            failure: BaseException | None = None
            try:
                result = function(argument)
            except BaseException as exc:  # delivered to the caller, who decides
                failure = exc
            # Back to the idle list before the caller hears, so that its next call
            # finds this thread instead of starting another one.
            keep = self._owner.give_back(self)
            try:
                if failure is None:
                    future.set_result(result)
                else:
                    future.set_exception(failure)
            except InvalidStateError:
                log.warning("adapter returned after its deadline; result dropped", extra=log_extra)
            del work, function, argument, future, result, failure
            if not keep:
                return


class AdapterCalls:
    """Runs `function(argument)` on a reusable daemon thread and waits at most `timeout`."""

    def __init__(self, keep_idle: int) -> None:
        self._keep_idle = keep_idle
        self._idle: list[_CallThread] = []
        self._lock = threading.Lock()
        self._started = 0
        self._closed = False

    def call(
        self,
        function: Callable[[Any], Any],
        argument: Any,
        timeout: float,
        log_extra: dict[str, Any] | None = None,
    ) -> Any:
        """The call's result or exception; CallTimedOut once `timeout` seconds have passed."""
        future: Future[Any] = Future()
        self._take().inbox.put((function, argument, future, log_extra or {}))
        try:
            return future.result(timeout=max(0.0, timeout))
        except FutureTimeout:
            # A pending future can always be cancelled: from now on the thread's
            # late answer finds it cancelled and is dropped.
            if future.cancel():
                raise CallTimedOut() from None
            return future.result()  # it answered in the instant between the two

    def _take(self) -> _CallThread:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self._started += 1
            number = self._started
        thread = _CallThread(self, number)
        thread.start()
        return thread

    def give_back(self, thread: _CallThread) -> bool:
        """Whether the thread stays for another call (False: it ends)."""
        with self._lock:
            if self._closed or len(self._idle) >= self._keep_idle:
                return False
            self._idle.append(thread)
            return True

    def close(self) -> None:
        """End the idle threads; a call still running ends its thread when it returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for thread in idle:
            thread.inbox.put(None)
