"""JSON Pointer updates to request data, and validation of the data they produce."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable
from typing import Any

from jsonpointer import JsonPointer
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing.exceptions import Unresolvable

from orquestador.domain.canonical import canonical_json
from orquestador.domain.errors import DataValidationError, Problem, UpdateError
from orquestador.domain.mappings import array_index, pointer_parts

MAX_DATA_BYTES = 262_144


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
        raise UpdateError(f"{path}: index {index} is past the end of an array of {len(array)}")
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


@functools.cache
def _meta_validator() -> Draft202012Validator:
    # Building a validator resolves the meta-schema's vocabularies; do it once.
    return Draft202012Validator(Draft202012Validator.META_SCHEMA)


def schema_problems(schema: Any, prefix: str = "") -> list[Problem]:
    """Every reason ``schema`` is not a valid draft 2020-12 JSON Schema."""
    errors = sorted(_meta_validator().iter_errors(schema), key=_error_order)
    return [
        Problem(prefix + _json_pointer(e.absolute_path), f"invalid JSON Schema: {e.message}")
        for e in errors
    ]


def _error_order(error: ValidationError) -> tuple[str, str]:
    return _json_pointer(error.absolute_path), error.message


_CheckedSchema = tuple[tuple[Problem, ...], Draft202012Validator | None]


def _check_and_compile(schema: Any) -> _CheckedSchema:
    """The schema's meta-schema problems, or its compiled validator when it has none."""
    problems = schema_problems(schema, "/dataSchema")
    if problems:
        return tuple(problems), None
    # Formats are checked too: an operator who writes "format": "email"
    # expects it to hold, although 2020-12 only annotates by default.
    return (), Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


@functools.lru_cache(maxsize=256)
def _checked_from_json(schema_json: str) -> _CheckedSchema:
    # Built from its own parsed copy, so a caller mutating its dict later cannot
    # change what is cached.
    return _check_and_compile(json.loads(schema_json))


def _checked(schema: Any) -> _CheckedSchema:
    """Checked and compiled once per distinct schema: a published flow's dataSchema never
    changes, and the meta-schema check used to dominate the cost of every validation."""
    try:
        # Key order is kept (not sorted) so that messages quoting parts of the schema
        # read exactly as they would for the caller's own document.
        key = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return _check_and_compile(schema)  # not JSON: nothing sound to cache it under
    if json.loads(key) != schema:
        return _check_and_compile(schema)  # e.g. non-string keys: the text is not the schema
    return _checked_from_json(key)


def validate_request_data(
    data: Any, schema: dict[str, Any], max_bytes: int = MAX_DATA_BYTES
) -> None:
    """Raise ``DataValidationError`` listing every way ``data`` breaks the schema or size limit."""
    schema_errors, validator = _checked(schema)
    if schema_errors:
        raise DataValidationError(list(schema_errors))
    assert validator is not None
    try:
        size = len(canonical_json(data))
    except (TypeError, ValueError) as exc:
        raise DataValidationError([Problem("", f"data is not JSON: {exc}")]) from None
    try:
        errors = sorted(validator.iter_errors(data), key=_error_order)
    except Unresolvable as exc:
        raise DataValidationError([Problem("/dataSchema", f"unresolvable $ref: {exc}")]) from None
    problems = [Problem(_json_pointer(e.absolute_path), e.message) for e in errors]
    if size > max_bytes:
        problems.append(Problem("", f"data is {size} bytes as JSON; the limit is {max_bytes}"))
    if problems:
        raise DataValidationError(problems)
