"""Adapter calls on their own threads, so that a job stops waiting at the adapter's deadline.

Python cannot kill a thread. A call that overruns its timeout is abandoned, not
stopped: the job records the outcome as uncertain, the call's stop signal is set, and
whatever the call returns later is dropped (the job no longer listens, and every
write goes through the job anyway). What a non-cooperative adapter still costs is its
thread, until it returns by itself. Threads are daemons, so a call that never returns
cannot keep the process from exiting, and idle ones are reused.

An abandoned call is still a call: its request may not have left the process yet,
and a provider asked meanwhile truthfully says it has no such write. So an abandoned
call made under an external key stays known by that key until its thread ends
(`lingering`), and whoever asks the provider about the key first waits for it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from orquestador import tracing

log = logging.getLogger(__name__)


class CallTimedOut(Exception):
    """The adapter did not return before its deadline; its outcome is unknown."""


class _Answer:
    """A call's answer, waited for until a deadline; an abandoned call's answer is dropped.

    Bare locks rather than a Future: a job makes this hand-off for every action, and
    a Future's condition variable costs several times as much.
    """

    __slots__ = ("_deadline", "_done", "_error", "_lock", "_state", "_value")

    _PENDING, _ANSWERED, _ABANDONED = 0, 1, 2

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline  # time.monotonic(): the call context's own deadline
        self._state = self._PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # guards _state
        self._done = threading.Lock()  # released once answered
        self._done.acquire()

    def give(self, value: Any, error: BaseException | None) -> bool:
        """From the call thread, once the call ended; False when the caller no longer
        listens (its late answer is dropped, and `ended` now says the call is over).

        An answer at or past the deadline is late even if the caller has not noticed
        yet: the context's should_stop() said so, and a cooperative adapter that
        returned on it must not be taken for one that finished in time."""
        with self._lock:
            if self._state == self._PENDING and time.monotonic() >= self._deadline:
                self._state = self._ABANDONED
            abandoned = self._state == self._ABANDONED
            if not abandoned:
                self._state = self._ANSWERED
                self._value, self._error = value, error
        self._done.release()
        return not abandoned

    def ended(self, timeout: float) -> bool:
        """For an abandoned call: True once its thread returned, waiting at most `timeout`."""
        if not self._done.acquire(timeout=max(0.0, timeout)):
            return False
        self._done.release()  # anyone else who asks sees it ended too
        return True

    def wait(self) -> bool:
        """True once answered in time; False (and abandoned for good) at the deadline."""
        if not self._done.acquire(timeout=max(0.0, self._deadline - time.monotonic())):
            with self._lock:
                if self._state != self._ANSWERED:
                    self._state = self._ABANDONED
                    return False
            self._done.acquire()  # it answered in time, in the instant between the two
            return True
        if self._state == self._ANSWERED:
            return True
        self._done.release()  # a late answer: its call ended, as `ended` will say
        return False

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


_Work = tuple[Callable[[Any], Any], Any, _Answer, dict[str, Any], str | None]


class Lingering:
    """An abandoned call made under an external key whose thread has not returned yet."""

    __slots__ = ("_answer", "abandoned_at")

    def __init__(self, answer: _Answer, abandoned_at: float) -> None:
        self._answer = answer
        self.abandoned_at = abandoned_at  # time.monotonic()

    def ended(self, timeout: float) -> bool:
        """True once the call's thread returned, waiting at most `timeout` seconds."""
        return self._answer.ended(timeout)


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
            function, argument, answer, log_extra, key = work
            result: Any = None
            failure: BaseException | None = None
            try:
                result = function(argument)
            except BaseException as exc:  # delivered to the caller, who decides
                failure = exc
            # Back to the idle list before the caller hears, so that its next call
            # finds this thread instead of starting another one.
            keep = self._owner.give_back(self)
            if not answer.give(result, failure):
                log.warning("adapter returned after its deadline; result dropped", extra=log_extra)
                if key is not None:
                    self._owner.forget(key, answer)
            del work, function, argument, answer, result, failure
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
        self._lingering: dict[str, Lingering] = {}  # abandoned calls by external key

    def call(
        self,
        function: Callable[[Any], Any],
        argument: Any,
        deadline: float,
        log_extra: dict[str, Any] | None = None,
        key: str | None = None,
    ) -> Any:
        """The call's result or exception; CallTimedOut once `deadline` (time.monotonic())
        has passed, whether the call is still running or answered too late.

        `key`: the external key the call writes under; if the call is abandoned, it
        stays `lingering` under that key until its thread returns.
        """
        answer = _Answer(deadline)
        # The call runs inside the caller's span (the step's attempt), on its thread.
        function = tracing.carried(function)
        self._take().inbox.put((function, argument, answer, log_extra or {}, key))
        if not answer.wait():
            # Abandoned: from now on the thread's late answer is dropped.
            if key is not None:
                self._linger(key, answer)
            raise CallTimedOut()
        return answer.result()

    @staticmethod
    def inline(function: Callable[[Any], Any], argument: Any, deadline: float) -> Any:
        """`call` on the caller's own thread, for an adapter declared `inline` (it cannot
        block): the same rule for the answer, checked once it returned, since nothing
        can stop waiting for it earlier. Saves the two thread hand-offs of a call."""
        try:
            result = function(argument)
        except BaseException:  # as a call thread delivers it, unless it came too late
            if time.monotonic() >= deadline:
                raise CallTimedOut() from None
            raise
        if time.monotonic() >= deadline:
            raise CallTimedOut()
        return result

    def _linger(self, key: str, answer: _Answer) -> None:
        with self._lock:
            self._lingering[key] = Lingering(answer, time.monotonic())
        if answer.ended(0):
            self.forget(key, answer)  # it returned before it was registered

    def forget(self, key: str, answer: _Answer) -> None:
        """The abandoned call under `key` returned: it no longer lingers."""
        with self._lock:
            found = self._lingering.get(key)
            if found is not None and found._answer is answer:
                del self._lingering[key]

    def lingering(self, key: str) -> Lingering | None:
        """The abandoned call still running under `key`, if there is one."""
        with self._lock:
            return self._lingering.get(key)

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
