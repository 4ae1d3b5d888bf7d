"""The INTEGRATIONS_FILE format: `[[route]]` tables read with tomllib, checked one problem a line.

A route is operator configuration, never data: its URL base and headers may name
environment variables (`${NAME}`), expanded here once; `{name}` parts of the path
are filled from the action's inputs at call time, percent-encoded. Every problem
names the file, the line of the route's key when it can be found, the route and
the key, so `orquestador check` can print them all in one go.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orquestador.actions.contracts import DRY_RUN_CHOICES, DryRun, Effect, RateLimit
from orquestador.domain.schemas import instance_errors, schema_problems, validator_for
from orquestador.errors import ConfigError
from orquestador.integrations.document import (
    DOCUMENT_INPUT_SCHEMA,
    DOCUMENT_OUTPUT_SCHEMA,
    is_document_verify,
)

DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
EXTERNAL_KEY = "externalKey"

_ROUTE_KEYS = {
    "capability",
    "version",
    "effect",
    "method",
    "url",
    "headers",
    "timeout_seconds",
    "max_attempts",
    "idempotency_header",
    "input_schema",
    "output_schema",
    "response",
    "body",
    "lookup",
    "example",
    "dry_run",
    "use_environment_proxy",
    "rate_limit",
}
_RATE_LIMIT_KEYS = {"per_second", "burst"}
_LOOKUP_KEYS = {"method", "url", "found", "timeout_seconds"}
_ENV = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CAPABILITY = re.compile(r"^[a-z][a-z0-9_.-]{0,127}$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_POINTER = re.compile(r"^(/([^~]|~[01])*)*$")


@dataclass(frozen=True)
class LookupRoute:
    """How to ask the provider for the write keyed by the external key."""

    method: str
    url: str  # expanded; `{externalKey}` and input names are filled at call time
    found: str  # JSON Pointer to the record in the answer; "" is the whole body
    timeout_seconds: float | None


@dataclass(frozen=True)
class Route:
    """One `[[route]]`: a capability served by an HTTP call the operator configured."""

    capability: str
    version: int
    effect: Effect
    method: str
    url: str  # expanded base; `{name}` parts are filled from the inputs
    headers: dict[str, str] = field(repr=False)  # may hold secrets: never printed
    timeout_seconds: float
    max_attempts: int
    idempotency_header: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    response: dict[str, str] | None
    # The request body built from the inputs: body field -> {from = pointer} | {const = v};
    # None sends the inputs as they are.
    body: dict[str, dict[str, Any]] | None
    lookup: LookupRoute | None
    example: dict[str, Any] | None
    use_environment_proxy: bool
    line: int
    # "call": a dry run calls this READ_ONLY route for real; by default it answers
    # `example` or fails SIMULATION_UNSUPPORTED, and nothing is sent.
    dry_run: DryRun = "simulate"
    # Shared by every worker through the database; None: calls are not limited.
    rate_limit: RateLimit | None = None

    @property
    def key(self) -> str:
        return f"{self.capability}@{self.version}"


def load_routes(path: str | Path, environ: Mapping[str, str], lease_seconds: float) -> list[Route]:
    """The routes of the file; ConfigError with one line per problem."""
    routes, problems = route_file_problems(path, environ, lease_seconds)
    if problems:
        raise ConfigError(problems)
    return routes


def route_file_problems(
    path: str | Path, environ: Mapping[str, str], lease_seconds: float
) -> tuple[list[Route], list[str]]:
    """Read and check the file: the routes that are valid and every problem found."""
    name = str(path)
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"INTEGRATIONS_FILE: cannot read {name}: {exc.__class__.__name__}"]
    try:
        document_ = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line N, column M)".
        return [], [f"{name}: not valid TOML: {exc}"]
    lines = _Lines(name, raw)
    problems: list[str] = []
    for key in document_:
        if key != "route":
            problems.append(f"{name}:{lines.top(key)}: unknown key {key!r} (expected [[route]])")
    tables = document_.get("route", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        problems.append(f"{name}:{lines.top('route')}: route must be written as [[route]] tables")
        return [], problems
    routes: list[Route] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(tables):
        checker = _RouteChecker(table, index, lines, environ, lease_seconds)
        route = checker.route()
        problems += checker.problems
        if route is None:
            continue
        if route.key in seen:
            problems.append(
                f"{name}:{route.line}: route {route.key}: capability: already configured by the "
                f"route at line {seen[route.key]}"
            )
            continue
        seen[route.key] = route.line
        routes.append(route)
    return routes, problems


class _Lines:
    """Where things are in the file, for messages: tomllib keeps no positions."""

    def __init__(self, name: str, raw: str) -> None:
        self.name = name
        self.text = raw.splitlines()
        self.headers = [
            number
            for number, line in enumerate(self.text, 1)
            if re.match(r"^\s*\[\[\s*route\s*\]\]", line)
        ]

    def top(self, key: str) -> int:
        for number, line in enumerate(self.text, 1):
            if re.match(rf"^\s*\[*\s*\"?{re.escape(key)}\"?\s*[=\].]", line):
                return number
        return 1

    def of(self, index: int, key: str | None = None) -> int:
        if index >= len(self.headers):
            return 1
        start = self.headers[index]
        end = self.headers[index + 1] if index + 1 < len(self.headers) else len(self.text) + 1
        if key is not None:
            for number in range(start + 1, end):
                if re.match(rf"^\s*\"?{re.escape(key)}\"?\s*[=.]", self.text[number - 1]):
                    return number
        return start


class _RouteChecker:
    def __init__(
        self,
        table: dict[str, Any],
        index: int,
        lines: _Lines,
        environ: Mapping[str, str],
        lease_seconds: float,
    ) -> None:
        self.table = table
        self.index = index
        self.lines = lines
        self.environ = environ
        self.lease_seconds = lease_seconds
        self.problems: list[str] = []
        capability, version = table.get("capability"), table.get("version")
        if isinstance(capability, str) and isinstance(version, int):
            self.label = f"{capability}@{version}"
        else:
            self.label = f"#{index + 1}"

    def problem(self, key: str, message: str) -> None:
        line = self.lines.of(self.index, key.split(".")[0] if key else None)
        self.problems.append(f"{self.lines.name}:{line}: route {self.label}: {key}: {message}")

    def route(self) -> Route | None:
        t = self.table
        for key in sorted(set(t) - _ROUTE_KEYS):
            self.problem(key, "unknown key")
        capability = t.get("capability")
        if not isinstance(capability, str) or not _CAPABILITY.match(capability):
            self.problem("capability", "must be a lower-case name such as 'billing.invoice'")
        version = t.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            self.problem("version", "must be a whole number from 1")
        fixed = (
            isinstance(capability, str)
            and isinstance(version, int)
            and is_document_verify(capability, version)
        )
        effect = self._effect(t.get("effect", "READ_ONLY" if fixed else None))
        method = t.get("method")
        if method not in METHODS:
            self.problem("method", f"must be one of {', '.join(METHODS)}")
        url, names = self._url("url", t.get("url"), allow_query_names=False)
        headers = self._headers(t.get("headers", {}))
        timeout = self._timeout("timeout_seconds", t.get("timeout_seconds", 10 if fixed else None))
        max_attempts = t.get("max_attempts", 3 if fixed else None)
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            self.problem("max_attempts", "must be a whole number from 1")
        idempotency_header = t.get("idempotency_header", DEFAULT_IDEMPOTENCY_HEADER)
        if not isinstance(idempotency_header, str) or not _TOKEN.match(idempotency_header):
            self.problem("idempotency_header", "must be an HTTP header name")
        if fixed:
            for key in ("input_schema", "output_schema"):
                if key in t:
                    self.problem(key, "document.verify@1 has a fixed contract; remove this key")
            input_schema, output_schema = DOCUMENT_INPUT_SCHEMA, DOCUMENT_OUTPUT_SCHEMA
        else:
            input_schema = self._schema("input_schema", t.get("input_schema", {"type": "object"}))
            output_schema = self._schema(
                "output_schema", t.get("output_schema", {"type": "object"})
            )
        response = self._response(t.get("response"))
        body = self._body(t.get("body"))
        lookup = self._lookup(t.get("lookup"), effect, names)
        example = t.get("example")
        if example is not None:
            if not isinstance(example, dict):
                self.problem("example", "must be a table")
            elif isinstance(output_schema, dict):
                for error in instance_errors(validator_for(output_schema), example)[:3]:
                    self.problem("example", f"breaks output_schema: {error.message}")
        dry_run = self._dry_run(t.get("dry_run", "simulate"), effect, example)
        rate_limit = self._rate_limit(t.get("rate_limit"))
        proxy = t.get("use_environment_proxy", False)
        if not isinstance(proxy, bool):
            self.problem("use_environment_proxy", "must be true or false")
        if self.problems:
            return None
        return Route(
            capability=capability,
            version=version,
            effect=effect,
            method=method,
            url=url,
            headers=headers,
            timeout_seconds=timeout,
            max_attempts=max_attempts,
            idempotency_header=idempotency_header,
            input_schema=input_schema,
            output_schema=output_schema,
            response=response,
            body=body,
            lookup=lookup,
            example=example,
            use_environment_proxy=proxy,
            line=self.lines.of(self.index),
            dry_run=dry_run,
            rate_limit=rate_limit,
        )

    def _rate_limit(self, value: Any) -> RateLimit | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem("rate_limit", "must be a table: { per_second = 10, burst = 20 }")
            return None
        for key in sorted(set(value) - _RATE_LIMIT_KEYS):
            self.problem(f"rate_limit.{key}", "unknown key")
        per_second = value.get("per_second")
        if not isinstance(per_second, int | float) or isinstance(per_second, bool):
            per_second = None
        if per_second is None or not per_second > 0:
            self.problem("rate_limit.per_second", "must be a number of calls greater than zero")
            return None
        # By default a second's worth of calls may go at once.
        burst = value.get("burst", max(1, math.ceil(per_second)))
        if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
            self.problem("rate_limit.burst", "must be a whole number of calls from 1")
            return None
        return RateLimit(per_second=float(per_second), burst=burst)

    def _dry_run(self, value: Any, effect: Effect, example: Any) -> DryRun:
        choice = next((c for c in DRY_RUN_CHOICES if c == value), None)
        if choice is None:
            self.problem("dry_run", 'must be "simulate" (the default) or "call"')
            return "simulate"
        if value == "call" and effect.writes:
            self.problem("dry_run", '"call" is for READ_ONLY routes: a dry run never sends a write')
        if value == "call" and example is not None:
            self.problem("dry_run", '"call" sends the request, so the example is never answered')
        return choice

    def _effect(self, value: Any) -> Effect:
        try:
            return Effect(value)
        except ValueError:
            self.problem("effect", f"must be one of {', '.join(e.value for e in Effect)}")
            return Effect.READ_ONLY

    def _expand(self, key: str, text: str) -> str | None:
        missing = False

        def value_of(match: re.Match[str]) -> str:
            nonlocal missing
            name = match.group(1)
            if not _ENV_NAME.match(name):
                self.problem(key, f"${{{name}}} is not an environment variable name")
                missing = True
                return ""
            if not self.environ.get(name):
                self.problem(key, f"${{{name}}} is not set in the environment")
                missing = True
                return ""
            return self.environ[name]

        expanded = _ENV.sub(value_of, text)
        return None if missing else expanded

    def _url(self, key: str, value: Any, allow_query_names: bool) -> tuple[str, list[str]]:
        if not isinstance(value, str) or not value:
            self.problem(key, "must be an http:// or https:// URL")
            return "", []
        # ${ENV} only in the base: nothing after the first {name} part may name one.
        first = _PLACEHOLDER.search(_ENV.sub("", value))
        if first and "${" in value[value.find("{" + first.group(1) + "}") :]:
            self.problem(key, "${NAME} is allowed only in the base, before any {name} part")
        expanded = self._expand(key, value)
        if expanded is None:
            return "", []
        if any(c in expanded for c in "\r\n\t "):
            self.problem(key, "must not contain spaces or line breaks")
            return "", []
        parts = urlsplit(expanded)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            self.problem(key, "must be an http:// or https:// URL with a host")
            return "", []
        if "{" in parts.netloc or parts.fragment:
            self.problem(key, "the scheme, host and port are fixed: no {name} there, no #fragment")
            return "", []
        if _PLACEHOLDER.search(parts.query) and not allow_query_names:
            self.problem(key, "{name} parts belong in the path")
            return "", []
        names = _PLACEHOLDER.findall(parts.path + "?" + parts.query)
        for name in names:
            if not _NAME.match(name):
                self.problem(key, f"{{{name}}} is not a name of an input")
        return expanded, names

    def _headers(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            self.problem("headers", "must be a table of header names and values")
            return {}
        headers: dict[str, str] = {}
        for name, text in value.items():
            if not _TOKEN.match(name) or not isinstance(text, str):
                self.problem("headers", f"{name!r} must be a header name with a text value")
                continue
            expanded = self._expand("headers", text)
            if expanded is None:
                continue
            if any(c in expanded for c in "\r\n\0"):
                # Say which header, never its value: it may be a secret.
                self.problem("headers", f"{name}: the value holds a line break")
                continue
            headers[name] = expanded
        return headers

    def _timeout(self, key: str, value: Any) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            self.problem(key, "must be a number of seconds greater than zero")
            return 1.0
        if not value < self.lease_seconds:
            self.problem(
                key,
                f"{value} is not below WORKER_LEASE_SECONDS={self.lease_seconds}: a call must end "
                "while its lease is held",
            )
        return float(value)

    def _schema(self, key: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.problem(key, "must be a table (a JSON Schema object)")
            return {}
        for problem in schema_problems(value):
            self.problem(key, f"{problem.path or '/'}: {problem.message}")
        return value

    def _response(self, value: Any) -> dict[str, str] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem("response", "must be a table of output names and JSON Pointers")
            return None
        for name, pointer in value.items():
            if not isinstance(pointer, str) or not _POINTER.match(pointer):
                self.problem("response", f"{name}: {pointer!r} is not a JSON Pointer")
        return value

    def _body(self, value: Any) -> dict[str, dict[str, Any]] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem("body", "must be a table of body fields and their sources")
            return None
        for name, source in value.items():
            if (
                not isinstance(source, dict)
                or len(source) != 1
                or not (("from" in source and isinstance(source["from"], str)) or "const" in source)
            ):
                self.problem(
                    "body", f'{name}: a source is {{ from = "/pointer" }} or {{ const = value }}'
                )
            elif "from" in source and not _POINTER.match(source["from"]):
                self.problem("body", f"{name}: {source['from']!r} is not a JSON Pointer")
        return value

    def _lookup(self, value: Any, effect: Effect, names: list[str]) -> LookupRoute | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.problem("lookup", "must be a table with method, url and found")
            return None
        for key in sorted(set(value) - _LOOKUP_KEYS):
            self.problem(f"lookup.{key}", "unknown key")
        if not effect.writes:
            self.problem("lookup", "a READ_ONLY route has no write to look up")
        method = value.get("method", "GET")
        if method != "GET":
            self.problem("lookup.method", "a lookup only reads: GET")
        url, _ = self._url("lookup.url", value.get("url"), allow_query_names=True)
        found = value.get("found", "")
        if not isinstance(found, str) or not _POINTER.match(found):
            self.problem("lookup.found", f"{found!r} is not a JSON Pointer")
        timeout = value.get("timeout_seconds")
        if timeout is not None:
            timeout = self._timeout("lookup.timeout_seconds", timeout)
        return LookupRoute(method=method, url=url, found=found, timeout_seconds=timeout)
