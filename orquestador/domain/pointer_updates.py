"""JSON Pointer updates to request data, and validation of the data they produce."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from jsonpointer import JsonPointer
from jsonschema.exceptions import ValidationError

from orquestador.domain.canonical import canonical_json
from orquestador.domain.errors import DataValidationError, Problem, UpdateError
from orquestador.domain.limits import MAX_DATA_BYTES, MAX_DATA_DEPTH, depth_problem
from orquestador.domain.mappings import array_index, pointer_parts
from orquestador.domain.schemas import data_validator, instance_errors

# A response or an execution's error detail lists at most this many problems, each
# message at most this long.
MAX_PROBLEMS = 100
MAX_MESSAGE_CHARS = 300


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
    message = error.message
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
