"""How an adapter reports an outcome other than success; any other exception is uncertain."""

from __future__ import annotations

from typing import Any


class ActionError(Exception):
    """The action did not complete."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class TransientError(ActionError):
    """The action failed before taking effect and is safe to try again."""

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ActionError):
    """The action failed and its effect did not happen; trying again will not help."""

    def __init__(
        self, code: str, message: str | None = None, *, observed: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        # What the step saw when it gave up (e.g. the command was "sent"); audited as is.
        self.observed = dict(observed or {})


class UncertainError(ActionError):
    """The action may or may not have taken effect."""


class NotReady(ActionError):
    """A READ_ONLY action's answer is not there yet: ask again later, spending no attempt.

    The engine parks the execution WAITING until `check_again_in` seconds have passed or
    what it waits for (`wait_key`, e.g. "machine_command:<id>") changes, whichever is
    first, and frees the thread. Only READ_ONLY adapters may raise it; the adapter measures
    its own deadline from `ctx.first_started_at`.
    """

    def __init__(
        self,
        check_again_in: float,
        *,
        wait_key: str | None = None,
        observed: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if check_again_in <= 0:
            raise ValueError("check_again_in must be positive")
        self.check_again_in = check_again_in
        self.wait_key = wait_key
        self.observed = dict(observed or {})
