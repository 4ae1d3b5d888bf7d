"""The `http` adapter: one call to an operator-configured route, its outcome in the engine's terms.

What a provider answers maps onto the action errors: a transient status (with its
Retry-After) is safe to retry, a refused connection never sent anything, a timeout
or a reset after the request went out may have written, any other 4xx is a
declared failure. Messages name the route and the status only: never a header,
the URL or its query, since those may carry secrets.
"""

from __future__ import annotations

import copy
import email.utils
import json
import logging
import os
import re
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

import requests
import urllib3.exceptions

from orquestador import tracing
from orquestador.actions.contracts import ActionContext, Adapter
from orquestador.actions.errors import PermanentError, TransientError, UncertainError
from orquestador.actions.lookup import Found, LookupResult, NotFound, Unknown
from orquestador.domain.errors import MappingError
from orquestador.domain.mappings import resolve_inputs
from orquestador.integrations.routes import EXTERNAL_KEY, Route

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 5.0
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PROBLEM_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# The attempt's deadline, sent with every request: a provider may refuse what arrives late.
REQUEST_DEADLINE = "Request-Deadline"


def _without_request_lines(record: logging.LogRecord) -> bool:
    # urllib3 logs each request line at DEBUG, query string included: a route's query may
    # carry a key from the environment, so those lines never leave this process.
    return record.levelno > logging.DEBUG


logging.getLogger("urllib3.connectionpool").addFilter(_without_request_lines)

_sessions: dict[tuple[int, bool], requests.Session] = {}
_sessions_lock = threading.Lock()


def session_for(use_environment_proxy: bool) -> requests.Session:
    """One pooled Session per worker process (a forked child builds its own)."""
    key = (os.getpid(), use_environment_proxy)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            session = requests.Session()
            # Proxies, .netrc and CA overrides from the environment are not configuration.
            session.trust_env = use_environment_proxy
            session.verify = True
            pool = requests.adapters.HTTPAdapter(pool_connections=16, pool_maxsize=32)
            session.mount("http://", pool)
            session.mount("https://", pool)
            _sessions[key] = session
        return session


def http_adapter(route: Route) -> Adapter:
    """The adapter serving `route`; it calls nothing until the worker invokes it."""
    lookup = None
    if route.lookup is not None:

        def lookup(ctx: ActionContext) -> LookupResult:
            return look_up(route, ctx)

    simulate = None
    if route.example is not None:
        example = route.example

        def simulate(ctx: ActionContext) -> dict[str, Any]:
            # A dry run answers the operator's example and calls nobody.
            ctx.observe({"summary": f"would call {route.method} {route.capability}"})
            return copy.deepcopy(example)

    return Adapter(
        capability=route.capability,
        version=route.version,
        effect=route.effect,
        input_schema=route.input_schema,
        output_schema=route.output_schema,
        timeout_seconds=route.timeout_seconds,
        max_attempts=route.max_attempts,
        invoke=lambda ctx: call(route, ctx),
        simulate=simulate,
        dry_run=route.dry_run,
        rate_limit=route.rate_limit,
        lookup=lookup,
        lookup_timeout_seconds=(route.lookup.timeout_seconds if route.lookup else None),
    )


def fill_url(template: str, values: dict[str, Any], route: Route) -> str:
    """The template with each `{name}` replaced by its value, percent-encoded as one segment.

    `safe=""` encodes `/ ? # @ : %` and control characters, so a value can neither
    leave its path segment nor change the scheme, host or port. A segment that would
    read as `.` or `..` is refused: a client or a server may collapse it.
    """
    base = urlsplit(template)

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values or values[name] is None or isinstance(values[name], dict | list):
            raise PermanentError(
                "INPUT_INVALID", f"route {route.key}: input {name!r} is needed in the URL"
            )
        value = values[name]
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        if not text:
            raise PermanentError(
                "INPUT_INVALID", f"route {route.key}: input {name!r} is empty in the URL"
            )
        return quote(text, safe="")

    path = _PLACEHOLDER.sub(value_of, base.path)
    query = _PLACEHOLDER.sub(value_of, base.query)
    if any(segment in (".", "..") for segment in path.split("/")[1:]):
        raise PermanentError(
            "INPUT_INVALID", f"route {route.key}: an input makes a '.' or '..' path segment"
        )
    url = f"{base.scheme}://{base.netloc}{path}"
    return f"{url}?{query}" if query else url


def request_body(route: Route, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs, or the route's body template filled from them (pointers into the inputs)."""
    if route.body is None:
        return inputs
    try:
        return resolve_inputs(route.body, inputs)
    except MappingError as exc:
        # Refused before anything is sent: nothing can have happened at the provider.
        raise PermanentError(
            "INPUT_INVALID", f"route {route.key}: the body template: {exc.message}"
        ) from None


def call(route: Route, ctx: ActionContext) -> dict[str, Any]:
    if ctx.simulation and route.dry_run != "call":
        # The engine answers a dry run without calling (example, or SIMULATION_UNSUPPORTED);
        # this is the second lock on that door, for anyone who calls the adapter directly.
        raise PermanentError(
            "SIMULATION_UNSUPPORTED", f"route {route.key}: a dry run does not call this route"
        )
    url = fill_url(route.url, ctx.inputs, route)
    headers = {**route.headers, route.idempotency_header: ctx.external_key}
    body = None if route.method == "GET" else request_body(route, ctx.inputs)
    status, payload = _send(route, ctx, route.method, url, headers, body, "call")
    if 200 <= status < 300:
        if payload is None:
            # It worked, but what it made cannot be read: a write may have happened.
            raise UncertainError(f"route {route.key}: HTTP {status} with a body that is not JSON")
        return map_response(route, payload)
    raise _failure(route, status, payload)


def look_up(route: Route, ctx: ActionContext) -> LookupResult:
    assert route.lookup is not None
    url = fill_url(route.lookup.url, {**ctx.inputs, EXTERNAL_KEY: ctx.external_key}, route)
    headers = {**route.headers, route.idempotency_header: ctx.external_key}
    try:
        status, payload = _send(route, ctx, "GET", url, headers, None, "lookup")
    except (TransientError, UncertainError):
        return Unknown()
    if status == 404:
        return NotFound()
    if status != 200 or payload is None:
        return Unknown()
    record = resolve(payload, route.lookup.found)
    if record is _MISSING or record is None or record == [] or record == {}:
        return NotFound()
    if not isinstance(record, dict):
        return Unknown()
    return Found(map_response(route, record))


def map_response(route: Route, payload: Any) -> dict[str, Any]:
    """The output: each name taken from its pointer, or the whole body without a mapping."""
    if route.response is None:
        if not isinstance(payload, dict):
            raise UncertainError(f"route {route.key}: the answer is not a JSON object")
        return payload
    output = {}
    for name, pointer in route.response.items():
        value = resolve(payload, pointer)
        if value is not _MISSING:
            output[name] = value
    return output


_MISSING = object()


def resolve(document: Any, pointer: str) -> Any:
    """The value at a JSON Pointer, or _MISSING."""
    if pointer == "":
        return document
    value = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
    return value


def _send(
    route: Route,
    ctx: ActionContext,
    method: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    what: str,
) -> tuple[int, Any]:
    """(status, JSON body or None); raises the action error a failed exchange means."""
    ctx.check_deadline(f"the {what} of route {route.key}")
    # The route's span, a child of the step's attempt; the provider receives its
    # traceparent. Attributes name the route, never the URL (it may carry secrets).
    with tracing.span(
        f"route.{what}",
        {"orquestador.route": route.key, "http.request.method": method},
        kind="client",
    ):
        tracing.inject_headers(headers)  # the caller's own dict, made for this request
        return _exchange(route, ctx, method, url, headers, body, what)


def _exchange(
    route: Route,
    ctx: ActionContext,
    method: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    what: str,
) -> tuple[int, Any]:
    session = session_for(route.use_environment_proxy)
    # The last look at the deadline before the request leaves: a worker paused past it
    # (and past its lease) must not send, since another holder may have looked the write
    # up and made it again. What remains is a pause between here and the socket write.
    ctx.check_deadline(f"the {what} of route {route.key}")
    left = max(ctx.seconds_left(), 0.001)
    headers[REQUEST_DEADLINE] = ctx.deadline_text()
    try:
        response = session.request(
            method,
            url,
            json=body,
            headers=headers,
            timeout=(min(CONNECT_TIMEOUT_SECONDS, left), left),
            allow_redirects=False,
            stream=True,
        )
    except requests.exceptions.ConnectTimeout:
        raise TransientError(f"route {route.key}: connection timed out before sending") from None
    except requests.exceptions.SSLError:
        raise PermanentError(
            "TLS_VERIFICATION_FAILED", f"route {route.key}: the TLS certificate was refused"
        ) from None
    except requests.exceptions.ConnectionError as exc:
        if _never_sent(exc):
            raise TransientError(f"route {route.key}: connection refused") from None
        raise UncertainError(
            f"route {route.key}: the connection broke after the {what} was sent"
        ) from None
    except requests.exceptions.Timeout:
        raise UncertainError(f"route {route.key}: no answer within the timeout") from None
    except requests.exceptions.RequestException:
        raise UncertainError(f"route {route.key}: the {what} failed") from None
    with response:
        try:
            data = _read_capped(response, ctx)
        except _TooLarge:
            if 200 <= response.status_code < 300:
                raise UncertainError(
                    f"route {route.key}: HTTP {response.status_code} answer larger than 1 MiB"
                ) from None
            data = b""
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError):
            raise UncertainError(
                f"route {route.key}: the answer broke off (HTTP {response.status_code})"
            ) from None
        status = response.status_code
        retry_after = response.headers.get("Retry-After")
    tracing.note("http.response.status_code", status)  # on the route's span, a retry's too
    log.info(
        "route answered",
        extra={"route": route.key, "status": status, "attempt": ctx.attempt, "what": what},
    )
    if status in TRANSIENT_STATUSES:
        raise TransientError(
            f"route {route.key}: HTTP {status}", retry_after=parse_retry_after(retry_after)
        )
    try:
        payload = json.loads(data) if data.strip() else ({} if status == 204 else None)
    except ValueError:
        payload = None
    return status, payload


class _TooLarge(Exception):
    pass


def _read_capped(response: requests.Response, ctx: ActionContext) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_content(64 * 1024):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if time.monotonic() >= ctx.deadline:
            raise requests.exceptions.Timeout()
    return b"".join(chunks)


def _never_sent(exc: requests.exceptions.ConnectionError) -> bool:
    """True when the connection was never made (refused, no route): nothing reached the provider."""
    reason = exc.args[0] if exc.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    return isinstance(
        reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from now: the header as a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _failure(route: Route, status: int, payload: Any) -> PermanentError | UncertainError:
    if 300 <= status < 400:
        return PermanentError(
            f"HTTP_{status}", f"route {route.key}: HTTP {status} (redirects are not followed)"
        )
    if 400 <= status < 500:
        code = payload.get("code") if isinstance(payload, dict) else None
        if not isinstance(code, str) or not _PROBLEM_CODE.match(code):
            code = f"HTTP_{status}"
        return PermanentError(code, f"route {route.key}: HTTP {status}")
    if status in (501, 505):
        return PermanentError(f"HTTP_{status}", f"route {route.key}: HTTP {status}")
    # Another 5xx or an unexpected status: the provider may have acted.
    return UncertainError(f"route {route.key}: HTTP {status}")
