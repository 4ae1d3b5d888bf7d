"""The evaluation context and the mapping sources that read from it."""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from jsonpointer import JsonPointer, JsonPointerException

from orquestador.domain.errors import MappingError

# RFC 6901 array index: no sign, no leading zeros, no "-" (the past-the-end
# position, which never exists when reading).
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


def pointer_parts(pointer: str) -> list[str]:
    """Split an RFC 6901 pointer into unescaped tokens; ``ValueError`` if malformed."""
    if not isinstance(pointer, str):
        raise ValueError(f"a JSON Pointer is a string, not {type(pointer).__name__}")
    try:
        return list(JsonPointer(pointer).parts)
    except JsonPointerException as exc:
        raise ValueError(f"malformed JSON Pointer {pointer!r}: {exc}") from None


# Longer tokens name an index past the end of any array: reading them as an int
# would only spend time, or fail past Python's limit on integer digits.
_MAX_INDEX_DIGITS = 18


def array_index(token: str) -> int | None:
    """The array index a token names, or None when it is not a valid index."""
    if not _ARRAY_INDEX.fullmatch(token):
        return None
    return int(token) if len(token) <= _MAX_INDEX_DIGITS else 10**_MAX_INDEX_DIGITS


def find(document: Any, parts: Sequence[str]) -> tuple[bool, Any]:
    """Walk ``parts`` through ``document``: (True, value) or (False, None)."""
    current = document
    for token in parts:
        if isinstance(current, Mapping):
            if token not in current:
                return False, None
            current = current[token]
        elif isinstance(current, list):
            index = array_index(token)
            if index is None or index >= len(current):
                return False, None
            current = current[index]
        else:
            return False, None
    return True, current


def build_context(
    data: Any,
    action_outputs: Mapping[str, Any],
    request_id: str | uuid.UUID,
    state: str,
) -> dict[str, Any]:
    """The document that mapping sources and decision inputs point into."""
    return {
        "data": data,
        "actions": dict(action_outputs),
        # Ids are strings in JSON; a UUID object would not compare equal to a
        # literal in a decision table nor serialize canonically.
        "request": {"id": str(request_id), "state": state},
    }


# `{"format": "Reboot {/data/machineId}: {/data/reason}"}`: a text of the request data.
# Placeholders are JSON Pointers into the request data; `{{` and `}}` are literal braces.
MAX_FORMAT_CHARACTERS = 1000
MAX_FORMAT_PLACEHOLDERS = 20
# A value longer than this is cut (ending in "…"): a formatted text stays bounded.
MAX_FORMATTED_VALUE_CHARACTERS = 200
_FORMAT_PART = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def format_placeholders(template: str) -> list[str]:
    """The pointers a format names, in order; ValueError for a lone brace or a pointer
    that is no pointer into the request data."""
    found = []
    for match in _FORMAT_PART.finditer(template):
        text = match.group(0)
        if text in ("{{", "}}"):
            continue
        pointer = match.group(1)
        if pointer is None:
            raise ValueError(f"a lone {text!r}: write {text * 2!r} for the brace itself")
        parts = pointer_parts(pointer)
        if len(parts) < 2 or parts[0] != "data":
            raise ValueError(
                f"{{{pointer}}} must read the request data (/data/...): nothing else goes in"
                " a format"
            )
        found.append(pointer)
    return found


def _formatted(value: Any) -> str:
    """A value as a format shows it: text as it is, anything else as JSON; one line, and
    at most MAX_FORMATTED_VALUE_CHARACTERS."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = _CONTROL.sub(" ", text)
    if len(text) > MAX_FORMATTED_VALUE_CHARACTERS:
        text = text[: MAX_FORMATTED_VALUE_CHARACTERS - 1] + "…"
    return text


def format_text(template: str, context: Mapping[str, Any]) -> str:
    """The format's text with each `{/data/...}` replaced by the value it reads."""

    def part(match: re.Match[str]) -> str:
        text = match.group(0)
        if text in ("{{", "}}"):
            return text[0]
        pointer = match.group(1)
        if pointer is None:
            raise MappingError(f"format: a lone {text!r}")
        try:
            parts = pointer_parts(pointer)
        except ValueError as exc:
            raise MappingError(f"format: {exc}") from None
        if len(parts) < 2 or parts[0] != "data":
            raise MappingError(f"format: {{{pointer}}} does not read the request data")
        found, value = find(context, parts)
        if not found:
            raise MappingError(
                f"format: pointer {pointer} does not resolve in the request data", pointer=pointer
            )
        return _formatted(value)

    return _FORMAT_PART.sub(part, template)


def resolve_source(source: Mapping[str, Any], context: Mapping[str, Any]) -> Any:
    """The value of ``{"from": pointer}``, ``{"const": value}`` (a private copy) or
    ``{"format": text}`` (the text with the request data it names)."""
    if not isinstance(source, Mapping):
        raise MappingError(f"a source is an object, not {type(source).__name__}")
    if "from" in source:
        pointer = source["from"]
        try:
            parts = pointer_parts(pointer)
        except ValueError as exc:
            raise MappingError(str(exc)) from None
        found, value = find(context, parts)
        if not found:
            raise MappingError(
                f"pointer {pointer} does not resolve in the evaluation context", pointer=pointer
            )
        # Copies keep an adapter that edits its input from changing the
        # accepted snapshot or an earlier action's recorded output.
        return copy.deepcopy(value)
    if "const" in source:
        return copy.deepcopy(source["const"])
    if "format" in source:
        template = source["format"]
        if not isinstance(template, str):
            raise MappingError("a format is a text")
        return format_text(template, context)
    raise MappingError('a source needs "from" (a JSON Pointer), "const" or "format"')


def resolve_inputs(
    input_mapping: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]
) -> dict[str, Any]:
    """Resolve every field of an action's input mapping."""
    resolved: dict[str, Any] = {}
    for field, source in input_mapping.items():
        try:
            resolved[field] = resolve_source(source, context)
        except MappingError as exc:
            raise MappingError(
                f"input {field!r}: {exc.message}", pointer=exc.pointer, field=field
            ) from None
    return resolved


def with_decision(context: Mapping[str, Any], decision: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``context`` that also exposes a decision's result under ``/decision``."""
    extended = dict(context)
    if decision is not None:
        extended["decision"] = dict(decision)
    return extended
