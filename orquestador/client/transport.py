"""How the Python client makes a call: the URL, the token, the timeout, and what an answer means."""

from __future__ import annotations

import email.utils
import time
from typing import Any
from urllib.parse import quote

import requests

from orquestador.client.errors import ApiError, ApiUnreachable, NotTheApi, RequestNotSent

API_PATH = "/api/v1"
# (connect, read) seconds: a decision waits for a row lock another operator may hold.
DEFAULT_TIMEOUT = (5.0, 60.0)


def api_base(url: str) -> str:
    """The API's base URL from a server's address, with or without its /api/v1."""
    base = url.rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def segment(value: str) -> str:
    # An id is one path segment, whatever it contains; the server answers 404 to nonsense.
    return quote(str(value), safe="")


class Transport:
    """Calls of the API with one bearer token: JSON in, JSON out, problems raised."""

    def __init__(
        self,
        base_url: str,
        token: str,
        session: requests.Session | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> None:
        self.base_url = api_base(base_url)
        self.token = token
        self.session = session or requests.Session()
        # Read here rather than bound as the argument's default, so that it may be changed.
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout

    def close(self) -> None:
        self.session.close()

    @property
    def read_seconds(self) -> float | None:
        """How long a call waits for its answer (None: without end)."""
        return self.timeout[1] if isinstance(self.timeout, tuple) else self.timeout

    def call(self, method: str, path: str, **options: Any) -> Any:
        """The answer's JSON; None for 204. Raises a `ClientError` for anything else."""
        url = self.base_url + path
        try:
            response = self.session.request(
                method,
                url,
                headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
                timeout=self.timeout,
                **options,
            )
        except requests.ConnectionError as error:
            reason = connection_failure_reason(error)
            raise ApiUnreachable(
                f"cannot reach the API at {self.base_url}: {reason}", reason
            ) from None
        except requests.Timeout:
            waited = self.timeout[1] if isinstance(self.timeout, tuple) else self.timeout
            raise ApiUnreachable(
                f"the API at {self.base_url} did not answer within {waited:.0f} s",
                "timed out",
            ) from None
        except requests.RequestException as error:
            raise RequestNotSent(connection_failure_reason(error)) from None
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not response.ok:
            raise ApiError(
                response.status_code,
                body if isinstance(body, dict) else None,
                response.text,
                retry_after=_seconds(response.headers.get("Retry-After")),
            )
        if body is None:
            raise NotTheApi(url, response.status_code)
        return body


def _seconds(text: str | None) -> float | None:
    """Retry-After in seconds: a number of them (the API's), or an HTTP date (a proxy's);
    None when absent or unreadable."""
    if text is None:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when.timestamp() - time.time())


def connection_failure_reason(error: BaseException) -> str:
    """The operating system's words for a failed connection, else the error's first line."""
    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        # requests and urllib3 keep the cause in args, `reason` or the exception chain.
        pending += [*current.args, getattr(current, "reason", None)]
        pending += [current.__cause__, current.__context__]
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
