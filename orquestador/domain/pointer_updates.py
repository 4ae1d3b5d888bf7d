"""JSON Pointer updates to request data, and validation of the data they produce."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jsonpointer import JsonPointer
from jsonschema.exceptions import ValidationError

from orquestador.domain.canonical import canonical_json
from orquestador.domain.errors import DataSchemaError, DataValidationError, UpdateError
from orquestador.domain.limits import MAX_DATA_BYTES, MAX_DATA_DEPTH, depth_problem
from orquestador.domain.mappings import array_index, find, pointer_parts
from orquestador.domain.schemas import data_validator, instance_errors
from orquestador.errors import Problem

# A response or an execution's error detail lists at most this many problems, each
# message at most this long.
MAX_PROBLEMS = 100
MAX_MESSAGE_CHARS = 300
# An operator's correction (correct_request_data) changes at most this many paths.
MAX_CORRECTION_PATHS = 50


def _json_pointer(parts: Iterable[Any]) -> str:
    return JsonPointer.from_parts([str(part) for part in parts]).path


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    return "a number" if isinstance(value, int | float) else f"a {type(value).__name__}"


def update_path_problem(path: Any) -> str | None:
    """Why ``path`` cannot name the place an update writes in request data, or None.

    The same rule for a flow's `updates` and an operator's correction: a pointer into
    the data (``/amount``, not ``/data/amount``), never the whole data, never an append.
    """
    try:
        parts = pointer_parts(path)
    except ValueError as exc:
        return str(exc)
    if not parts:
        return 'the empty pointer "" would replace the whole request data'
    if "-" in parts:
        return "'-' (append) is not allowed in an update path"
    return None


def _parts_of(path: str) -> list[str]:
    try:
        parts = pointer_parts(path)
    except ValueError as exc:
        raise UpdateError(str(exc)) from None
    if not parts:
        raise UpdateError('the empty pointer "" would replace the whole request data')
    return parts


def _index_into(array: list[Any], token: str, path: str) -> int:
    # Writes stay inside the array: appending ("-" or len) or creating holes
    # would let a mapping grow lists the schema author never sized.
    index = array_index(token)
    if index is None:
        raise UpdateError(f"{path}: {token!r} is not an array index (no '-', no leading zeros)")
    if index >= len(array):
        shown = token if len(token) <= 20 else token[:17] + "..."
        raise UpdateError(f"{path}: index {shown} is past the end of an array of {len(array)}")
    return index


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    parts = _parts_of(path)
    parent: Any = document
    for token in parts[:-1]:
        if isinstance(parent, dict):
            # Missing parents become objects; the data schema has the last word.
            parent = parent.setdefault(token, {})
        elif isinstance(parent, list):
            parent = parent[_index_into(parent, token, path)]
        else:
            raise UpdateError(f"{path}: cannot descend into {_json_type(parent)} at {token!r}")
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent[_index_into(parent, last, path)] = copy.deepcopy(value)
    else:
        raise UpdateError(f"{path}: cannot set {last!r} inside {_json_type(parent)}")


def apply_updates(data: dict[str, Any], updates: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of ``data`` with each (pointer, value) written in order; input untouched."""
    result = copy.deepcopy(data)
    for path, value in updates:
        if not isinstance(path, str):
            raise UpdateError(f"an update path is a JSON Pointer string, not {path!r}")
        _set(result, path, value)
    return result


def _message(error: ValidationError) -> str:
    # Messages quote the offending value, which may be most of 256 KiB.
    message: str = error.message
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 3] + "..."


def validate_request_data(
    data: Any, schema: dict[str, Any], max_bytes: int = MAX_DATA_BYTES
) -> None:
    """Raise ``DataValidationError`` listing every way ``data`` breaks the schema or size limit.

    Sizes are checked first and alone: they are cheap, and they bound the work of
    validating. ``DataSchemaError`` (a ``DataValidationError``) when the schema
    itself cannot be used, with paths into the flow definition.
    """
    too_deep = depth_problem(data, MAX_DATA_DEPTH)
    if too_deep is not None:
        raise DataValidationError([too_deep])
    try:
        size = len(canonical_json(data))
    except (TypeError, ValueError) as exc:
        raise DataValidationError([Problem("", f"data is not JSON: {exc}")]) from None
    if size > max_bytes:
        raise DataValidationError(
            [Problem("", f"data is {size} bytes as JSON; the limit is {max_bytes}")]
        )
    errors = instance_errors(data_validator(schema), data)
    problems = [Problem(_json_pointer(e.absolute_path), _message(e)) for e in errors]
    if len(problems) > MAX_PROBLEMS:
        more = len(problems) - MAX_PROBLEMS
        problems = [*problems[:MAX_PROBLEMS], Problem("", f"and {more} more problems")]
    if problems:
        raise DataValidationError(problems)


@dataclass(frozen=True)
class CorrectedPath:
    """One path of a correction: what the data held there before (if anything), and after."""

    path: str
    existed: bool  # False: the path was not in the data before the correction
    before: Any
    after: Any

    def as_json(self) -> dict[str, Any]:
        """``{path, before, after}``; ``before`` left out when the path did not exist."""
        body: dict[str, Any] = {"path": self.path}
        if self.existed:
            body["before"] = self.before
        body["after"] = self.after
        return body


def correct_request_data(
    data: dict[str, Any],
    schema: dict[str, Any],
    correction: Sequence[tuple[str, Any]],
    max_bytes: int = MAX_DATA_BYTES,
) -> tuple[dict[str, Any], list[CorrectedPath]]:
    """The corrected copy of ``data``, and each path with its value before and after.

    A correction is updates that an operator writes: (pointer, value) pairs with the
    paths a flow's `updates` take, applied in order, the result checked against the
    schema and the size limit like any request data. Raises ``DataValidationError``
    whose problems point into the correction (``/N/path``, ``/N/value``; ``""`` for the
    correction as a whole), ``DataSchemaError`` when the schema itself cannot be used.
    """
    entries = list(correction)
    if not entries:
        raise DataValidationError([Problem("", "a correction changes at least one path")])
    if len(entries) > MAX_CORRECTION_PATHS:
        raise DataValidationError(
            [Problem("", f"a correction changes at most {MAX_CORRECTION_PATHS} paths")]
        )
    parts = _correction_parts(entries)
    corrected = copy.deepcopy(data)
    problems = []
    for n, (path, value) in enumerate(entries):
        try:
            _set(corrected, path, value)
        except UpdateError as exc:
            problems.append(Problem(f"/{n}/path", exc.message))
    if problems:
        raise DataValidationError(problems)
    try:
        validate_request_data(corrected, schema, max_bytes)
    except DataSchemaError:
        raise
    except DataValidationError as exc:
        raise DataValidationError(
            [_in_correction(problem, entries, parts) for problem in exc.problems]
        ) from None
    changes = []
    for (path, _), where in zip(entries, parts, strict=True):
        existed, before = find(data, where)
        changes.append(CorrectedPath(path, existed, before, find(corrected, where)[1]))
    return corrected, changes


def data_before_corrections(
    data: dict[str, Any], corrections: Sequence[Sequence[dict[str, Any]]]
) -> dict[str, Any]:
    """A copy of ``data`` as it was before ``corrections`` were applied to it.

    Each correction is the list its audit row keeps (``CorrectedPath.as_json``), oldest
    first; they are undone newest first, each path given back its value before, or
    removed when it had none. An object a correction created on the way to a new path
    (``/billing/vat`` in data without ``billing``) stays behind, empty: the audit row
    does not say that it was created.
    """
    result = copy.deepcopy(data)
    for correction in reversed(corrections):
        for change in correction:
            path = change["path"]
            if "before" in change:
                _set(result, path, change["before"])
                continue
            parts = _parts_of(path)
            found, parent = find(result, parts[:-1])
            if found and isinstance(parent, dict):
                parent.pop(parts[-1], None)
    return result


def _correction_parts(entries: list[tuple[str, Any]]) -> list[list[str]]:
    """Each path's tokens; refused when malformed, or inside another path of the same
    correction: each part of the data is corrected once, so before and after are one
    value each, and the audit row holds at most the data's size twice."""
    problems: list[Problem] = []
    parts: list[list[str]] = []
    for n, (path, _) in enumerate(entries):
        problem = update_path_problem(path)
        if problem is not None:
            problems.append(Problem(f"/{n}/path", problem))
            parts.append([])
            continue
        tokens = pointer_parts(path)
        for m, earlier in enumerate(parts):
            shorter = min(len(earlier), len(tokens))
            if earlier and tokens[:shorter] == earlier[:shorter]:
                problems.append(
                    Problem(f"/{n}/path", f"overlaps /{m}/path ({entries[m][0]}): one path each")
                )
                break
        parts.append(tokens)
    if problems:
        raise DataValidationError(problems)
    return parts


def _in_correction(
    problem: Problem, entries: list[tuple[str, Any]], parts: list[list[str]]
) -> Problem:
    """A problem of the corrected data (a data pointer), moved to the entry that caused it."""
    if problem.path == "" and "; the limit is " in problem.message:
        # Too large: the largest value is the one to shrink.
        sizes = [len(canonical_json(value)) for _, value in entries]
        return Problem(f"/{sizes.index(max(sizes))}/value", problem.message)
    at = pointer_parts(problem.path)
    located = f"{problem.path or '/'}: {problem.message}"
    # At or inside a corrected value: that value breaks the schema.
    inside = [n for n, tokens in enumerate(parts) if at[: len(tokens)] == tokens]
    if inside:
        n = inside[-1]
        return Problem(f"/{n}/value", problem.message if at == parts[n] else located)
    # Around corrected paths (a property the schema does not allow, say): the path the
    # message names, else the last of them.
    below = [n for n, tokens in enumerate(parts) if tokens[: len(at)] == at]
    if below:
        named = [n for n in below if repr(parts[n][len(at)]) in problem.message]
        return Problem(f"/{(named or below)[-1]}/path", located)
    return Problem("", located)
