"""The process's configured secret values, and replacing them in text before it is kept or logged.

SPEC 16: an unexpected adapter exception may quote what its code had at hand, an API
key included. Before such a message is stored or logged, every configured secret value
is replaced by `[redacted]`:

- environment variables whose name holds TOKEN, SECRET, KEY or PASSWORD;
- the password of any URL in the environment (`DATABASE_URL`, `SMTP_URL`, ...);
- the routes of INTEGRATIONS_FILE: every header value (and the credentials after a
  scheme such as `Bearer `) and the value of every `${NAME}` the file names.

Values shorter than MIN_SECRET_CHARACTERS are left alone: replacing every `1`, `on` or
`abc` would shred the message and hide nothing worth hiding. Each value is also matched
as it appears percent-encoded, JSON-escaped or in a Python repr.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

REDACTED = "[redacted]"
MIN_SECRET_CHARACTERS = 4
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD", re.IGNORECASE)
# Settings that name a secret but hold a switch or a word, never the secret itself.
_NOT_SECRET = frozenset({"true", "false", "yes", "no", "none", "null", "on", "off"})
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _forms(value: str) -> set[str]:
    """`value` as an exception text may quote it."""
    stripped = value.strip()
    forms = {
        stripped,
        quote(stripped, safe=""),
        quote_plus(stripped),
        json.dumps(stripped)[1:-1],
        repr(stripped)[1:-1],
    }
    return {
        form
        for form in forms
        if len(form) >= MIN_SECRET_CHARACTERS and form.lower() not in _NOT_SECRET
    }


def _url_password(value: str) -> str | None:
    if "://" not in value or "@" not in value:
        return None
    try:
        return urlsplit(value.strip()).password
    except ValueError:
        return None


def route_secret_values(path: str, environ: Mapping[str, str]) -> set[str]:
    """The secret values of the routes in `path`: header values and `${NAME}` values.

    A file that cannot be read gives none: the worker refuses to start with it anyway.
    """
    # Imported here: a process without routes never loads the route checker.
    from orquestador.integrations.routes import route_file_problems

    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    values = {environ[name] for name in _ENV_REFERENCE.findall(raw) if environ.get(name)}
    # No lease bound here: only the headers are read, as the worker expands them.
    routes, _ = route_file_problems(path, environ, math.inf)
    for route in routes:
        for header in route.headers.values():
            values.add(header)
            _, space, credentials = header.strip().partition(" ")
            if space and credentials:
                values.add(credentials)  # `Bearer <token>`: the token alone, too
    return values


def configured_secret_values(environ: Mapping[str, str]) -> frozenset[str]:
    """Every configured secret value of a process with this environment, in every form."""
    values: set[str] = set()
    for name, value in environ.items():
        if SECRET_NAME.search(name):
            values.add(value)
        password = _url_password(value)
        if password:
            values.add(password)
    integrations_file = environ.get("INTEGRATIONS_FILE", "").strip()
    if integrations_file:
        values |= route_secret_values(integrations_file, environ)
    return frozenset(form for value in values for form in _forms(value))


def replace_values(text: str, replacements: Mapping[str, str]) -> str:
    """`text` with each key of `replacements` replaced, in one pass, longest key first.

    One pass: a replacement is never searched again, so `[redacted]` cannot itself be
    cut into by a shorter value.
    """
    if not replacements or not text:
        return text
    keys = sorted(replacements, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(key) for key in keys))
    return pattern.sub(lambda match: replacements[match.group(0)], text)


class _Known:
    """The secret values of the current environment, worked out again when it changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[object, ...] | None = None
        self._values: frozenset[str] = frozenset()

    def values(self) -> frozenset[str]:
        environ = dict(os.environ)
        path = environ.get("INTEGRATIONS_FILE", "").strip()
        try:
            stat = os.stat(path) if path else None
            stamp = (stat.st_mtime_ns, stat.st_size) if stat else None
        except OSError:
            stamp = None
        key = (hash(frozenset(environ.items())), path, stamp)
        with self._lock:
            if key != self._key:
                self._values = configured_secret_values(environ)
                self._key = key
            return self._values


_known = _Known()


def secret_values() -> frozenset[str]:
    """The configured secret values of this process (its environment and routes file)."""
    return _known.values()


def redact(text: str, also: Iterable[str] = ()) -> str:
    """`text` with every configured secret value, and each of `also`, as `[redacted]`."""
    values = set(secret_values())
    values.update(value for value in also if len(value) >= MIN_SECRET_CHARACTERS)
    return replace_values(text, dict.fromkeys(values, REDACTED))


def redact_json(value: Any) -> Any:
    """A copy of a JSON value with every configured secret value in its strings (keys
    included) as `[redacted]`: for what a person typed that the audit trail keeps."""
    replacements = dict.fromkeys(secret_values(), REDACTED)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return replace_values(item, replacements)
        if isinstance(item, dict):
            return {walk(key): walk(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    return walk(value)


# As long as the log formatter keeps of an exception's first line.
ERROR_LINE_MAX = 500


def error_line(exc: BaseException) -> str:
    """`Class: first line` of an infrastructure error (a database error's own words).

    SQLAlchemy's message repeats the whole statement; the driver's first line says
    what went wrong. Parameters are never part of either (engines hide them). Configured
    secrets are redacted, before the cut: an adapter's exception may end a job this way.
    """
    cause = getattr(exc, "orig", None) or exc
    text = replace_values(str(cause).strip(), dict.fromkeys(secret_values(), REDACTED))
    first = text.splitlines()[0][:ERROR_LINE_MAX] if text else ""
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__
