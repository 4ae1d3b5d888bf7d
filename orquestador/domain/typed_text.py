"""A value a person typed as text, read by the data schema at its path.

A correction's new value comes from a form field or a command-line argument: text. For a
field whose schema says it holds text, the text is the value, with or without JSON quotes
(`large` and `"large"` both mean the string large); for any other field the text is read
as JSON (`950`, `true`, `{"size": 2}`). Where the schema cannot say, the text must be
JSON, and the refusal says exactly how to quote it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orquestador.domain.errors import DomainError

# How far a chain of local `$ref`s is followed before the walk gives up (says "unknown").
_MAX_REFERENCES = 16

# Each JSON type as a refusal names it, with an example of how to write one.
_KIND_WORDS = {
    "integer": "a whole number such as 950",
    "number": "a number such as 9.5",
    "boolean": "true or false",
    "null": "null",
    "object": 'an object such as {"size": "large"}',
    "array": 'a list such as ["a", "b"]',
}


class TextNotUnderstood(DomainError):
    """The text cannot be read as a value of the field at its path."""

    code = "CORRECTION_INVALID"


def value_from_text(text: str, schema: Any, path: str) -> Any:
    """The value `text` stands for at `path` (a JSON Pointer into data of `schema`).

    TextNotUnderstood, with the words a person needs, when the text is neither JSON nor
    text the schema accepts as is.
    """
    kinds = kinds_at(schema, pointer_parts(path))
    try:
        parsed: Any = json.loads(text)
        understood = True
    except ValueError:
        parsed, understood = None, False
    if kinds is not None and "string" in kinds:
        # A text field: the text itself, unless it is JSON of a kind the field also takes
        # (a quoted string, or `null` for a field that may be null).
        if understood and (isinstance(parsed, str) or json_kinds(parsed) & kinds):
            return parsed
        return text
    if understood:
        return parsed
    quoted = json.dumps(text, ensure_ascii=False)
    if kinds:
        said = " or ".join(_KIND_WORDS[kind] for kind in sorted(kinds))
        raise TextNotUnderstood(message=f"{path} takes {said}, not the text {quoted}")
    raise TextNotUnderstood(
        message=f"not JSON, and the data schema does not say {path} holds text: give it "
        f"as JSON, text in quotes, e.g. {quoted}"
    )


def pointer_parts(path: str) -> list[str]:
    """A JSON Pointer's reference tokens, unescaped."""
    if not path:
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def json_kinds(value: Any) -> set[str]:
    """The JSON Schema types a value is an instance of."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    return {"object"}


def kinds_at(schema: Any, parts: Sequence[str]) -> set[str] | None:
    """The JSON types the schema allows at `parts`; None when the walk cannot tell
    (no schema there, combinators, patterns): the value then decides."""
    current = _resolved(schema, schema)
    for token in parts:
        if not isinstance(current, Mapping):
            return None
        properties = current.get("properties")
        if isinstance(properties, Mapping) and token in properties:
            current = _resolved(schema, properties[token])
        elif token.isdigit() and isinstance(current.get("items"), Mapping):
            prefix = current.get("prefixItems")
            index = int(token)
            if isinstance(prefix, list) and index < len(prefix):
                current = _resolved(schema, prefix[index])
            else:
                current = _resolved(schema, current["items"])
        else:
            return None
    return _kinds(current)


def _kinds(node: Any) -> set[str] | None:
    if not isinstance(node, Mapping):
        return None
    types = node.get("type")
    if isinstance(types, str):
        return {types}
    if isinstance(types, list) and all(isinstance(kind, str) for kind in types):
        return set(types)
    values = [node["const"]] if "const" in node else node.get("enum")
    if isinstance(values, list) and values:
        kinds: set[str] = set()
        for value in values:
            kinds |= json_kinds(value) - ({"number"} if isinstance(value, int) else set())
        return kinds
    return None


def _resolved(root: Any, node: Any) -> Any:
    """`node` with its local `$ref`s followed (`#/...` within `root`); None when a
    reference leads outside it or round in circles."""
    for _ in range(_MAX_REFERENCES):
        if not isinstance(node, Mapping) or "$ref" not in node:
            return node
        reference = node["$ref"]
        if not isinstance(reference, str) or not reference.startswith("#"):
            return None
        node = root
        for token in pointer_parts(reference[1:]):
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
    return None
