"""Regular expressions from flow content, run by RE2: linear in the text, never backtracking."""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

from orquestador.domain.limits import MAX_PATTERN_CHARS

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the author's problem, not a log line

# ECMA-262, the dialect JSON Schema names, writes a code point as \uXXXX; RE2 as \x{XXXX}.
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|.)", re.DOTALL)


class RegexError(ValueError):
    """The pattern cannot be run by the regular-expression engine."""


def _to_re2(pattern: str) -> str:
    return _ESCAPE.sub(lambda m: f"\\x{{{m.group(1)}}}" if m.group(1) else m.group(0), pattern)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """The compiled pattern; ``RegexError`` with the reason when RE2 cannot run it."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"a pattern has at most {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(_to_re2(pattern), _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(
            f"not a pattern this server can run ({reason}); patterns are RE2 syntax, "
            "without lookaround or backreferences"
        ) from None


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be published, or None when it may."""
    try:
        compile_pattern(pattern)
    except RegexError as exc:
        return str(exc)
    return None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``; ``RegexError`` if it cannot run."""
    return compile_pattern(pattern).search(text) is not None
