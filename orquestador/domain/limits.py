"""The published limits on flow content, and the walks that check a JSON document against them.

Flow definitions, data schemas and decision tables are written by flow authors
and evaluated by the server, so each has a size past which it is refused rather
than evaluated: every limit here bounds the time or memory of one request.
docs/FLOWS.md lists them; the flow definition's JSON Schema repeats the ones a
schema can express, so that clients see them too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonpointer import JsonPointer

from orquestador.errors import Problem

# --- request data -----------------------------------------------------------------

MAX_DATA_BYTES = 262_144  # canonical JSON of the request data (256 KiB)
MAX_DATA_DEPTH = 64  # nesting of the request data, as for any API body
# A platform event's data is read back as the text PostgreSQL prints for it, and only up
# to this size: the platform can store far more than the request data may hold, and a
# consumer must not load it to find that out. PostgreSQL's text adds a space after each
# separator and prints numbers in full, so this leaves room above MAX_DATA_BYTES, which
# still judges the data once it is read.
MAX_EVENT_DATA_TEXT_BYTES = 4 * MAX_DATA_BYTES

# --- data schemas -----------------------------------------------------------------

MAX_SCHEMA_BYTES = 65_536  # canonical JSON of one dataSchema (64 KiB)
MAX_SCHEMA_DEPTH = 32  # nesting of the dataSchema document itself
# $ref, allOf, anyOf, oneOf, not, if/then/else and dependentSchemas apply a schema to
# the same value; a chain of them longer than this is refused (a cycle always is).
MAX_SCHEMA_CHAIN = 32
# Longer regular expressions are refused; RE2 also refuses, on its own, a pattern
# whose compiled program would need more than its memory budget (8 MiB).
MAX_PATTERN_CHARS = 1_000
# Checking one document against a data schema stops after this many steps (one
# keyword applied to one value) or this much processor time, whichever comes first.
# 256 KiB of data checked by an ordinary schema takes a fraction of either; only
# schemas whose alternatives multiply with the depth of the data come near them.
MAX_VALIDATION_STEPS = 1_000_000
MAX_VALIDATION_SECONDS = 2.0

# --- numbers ----------------------------------------------------------------------

# Every number in a flow definition (a literal in a schema, a constant, a rule's
# output) is below this in magnitude, so that arithmetic on a thousand of them in
# doubles cannot overflow; a number in a unary test has at most this many digits.
MAX_NUMBER = 1e100
MAX_NUMBER_DIGITS = 100

# --- decision tables --------------------------------------------------------------

MAX_RULES = 1_000
MAX_INPUTS = 32
MAX_CELL_CHARS = 1_000
MAX_OUTPUT_NAMES = 32  # outputs in one rule's then
MAX_RANKED_OUTPUTS = 16  # outputs named in outputValues
MAX_RANKED_VALUES = 256  # values listed for one output in outputValues

# --- flow definitions ---------------------------------------------------------------

MAX_STATES = 200
MAX_TRANSITIONS = 200
MAX_ACTIONS = 50  # per transition
MAX_UPDATES = 100  # per transition
MAX_INPUT_FIELDS = 100  # per action
MAX_POINTER_CHARS = 1_000
MAX_TITLE_CHARS = 200
MAX_DESCRIPTION_CHARS = 2_000


def _pointer(parts: tuple[Any, ...]) -> str:
    return JsonPointer.from_parts([str(part) for part in parts]).path


def _walk(document: Any) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every value of ``document`` with its path, parents first, without recursion."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        yield value, path
        if isinstance(value, dict):
            stack.extend((item, (*path, key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))


def number_problem(value: Any) -> str | None:
    """Why a JSON number is out of bounds, or None (also for anything that is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not -MAX_NUMBER < value < MAX_NUMBER:  # exact for ints: no conversion to float
        return "numbers must lie strictly between -1e100 and 1e100"
    return None


def depth_problem(document: Any, max_depth: int, prefix: str = "") -> Problem | None:
    """The first place ``document`` nests deeper than ``max_depth`` levels, if any."""
    for _, path in _walk(document):
        if len(path) > max_depth:
            where = prefix + _pointer(path[:max_depth])
            return Problem(where, f"nests deeper than {max_depth} levels")
    return None


def number_problems(document: Any, prefix: str = "") -> list[Problem]:
    """Every out-of-bounds number in ``document``, at its path."""
    return [
        Problem(prefix + _pointer(path), reason)
        for value, path in _walk(document)
        if (reason := number_problem(value)) is not None
    ]
