"""The errors of the Python client: an error answer, no answer, or no call sent."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """A call of the API did not give an answer to use."""


class ApiError(ClientError):
    """The API answered with an error: its status, its problem document, its text."""

    def __init__(
        self,
        status: int,
        problem: dict[str, Any] | None,
        text: str,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.problem = problem
        self.text = text
        # Seconds the answer's Retry-After asks to wait before asking again (a 429's).
        self.retry_after = retry_after
        super().__init__(f"HTTP {status} {self.code}" if self.code else f"HTTP {status}")

    @property
    def code(self) -> str | None:
        """The problem's stable code (`NOT_FOUND`, `FLOW_INVALID`, ...), if it has one."""
        return (self.problem or {}).get("code")

    @property
    def detail(self) -> str | None:
        return (self.problem or {}).get("detail")


class ApiUnreachable(ClientError):
    """The API did not answer: no connection, or no answer in time."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RequestNotSent(ClientError):
    """The call could not be sent: the URL or the token is not one HTTP can carry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotTheApi(ClientError):
    """A success answer without JSON: the base URL is not the orquestador API."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"{url} answered {status} without JSON")
        self.url = url
        self.status = status
