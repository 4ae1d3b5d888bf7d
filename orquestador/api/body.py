"""Reading a POST body: JSON media type, size, syntax, storable text, known fields, shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import request
from jsonschema import Draft202012Validator
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wsgi import get_input_stream

from orquestador.api.problems import ApiProblem
from orquestador.domain.json_text import parse_json
from orquestador.errors import Problem

# Deeper documents are refused before any recursive code (validation, storage) sees them.
MAX_DEPTH = 64


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(parts: Any) -> str:
    return "".join(f"/{_escape(str(part))}" for part in parts)


def unstorable_text(text: str) -> str | None:
    # jsonb refuses NUL characters and unpaired surrogates, which json.loads lets through.
    if "\x00" in text:
        return "text must not contain the NUL character"
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        return "text must not contain unpaired surrogates"
    return None


def storage_problems(document: Any) -> list[Problem]:
    """Problems that would make PostgreSQL refuse the document, found without recursion."""
    problems: list[Problem] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            problems.append(Problem(pointer(path), f"nesting deeper than {MAX_DEPTH} levels"))
            continue
        if isinstance(value, str):
            reason = unstorable_text(value)
            if reason:
                problems.append(Problem(pointer(path), reason))
        elif isinstance(value, dict):
            for key, item in value.items():
                reason = unstorable_text(key)
                if reason:
                    problems.append(Problem(pointer((*path, key)), f"field name: {reason}"))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
    return sorted(problems, key=lambda p: p.path)


def _read_body() -> bytes:
    """The raw body, 413 when it exceeds the limit, with or without a Content-Length.

    A chunked body has no length to refuse up front, and werkzeug's bounded stream stops
    at the limit and hands back what it read, which would then parse as truncated JSON.
    Reading one byte past the limit tells a body at the limit from one over it.
    """
    limit = request.max_content_length
    if limit is None:
        return request.get_data(cache=False)
    raw = get_input_stream(request.environ, max_content_length=limit + 1).read()
    if len(raw) > limit:
        raise RequestEntityTooLarge()
    return raw


def read_json_object(schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The body as a JSON object; with a schema, unknown fields and shape errors are 422."""
    if not request.is_json:
        raise ApiProblem(415, "UNSUPPORTED_MEDIA_TYPE", "The body must be application/json.")
    try:
        document = parse_json(_read_body())
    except ValueError:
        raise ApiProblem(400, "MALFORMED_JSON", "The body is not valid JSON.") from None
    return checked_object(document, schema)


def checked_object(document: Any, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`document` when it is an object that can be stored and (given) has the schema's
    shape; else a 422 naming each problem. A page's form is checked by this too."""
    if not isinstance(document, dict):
        raise ApiProblem(
            422,
            "BODY_INVALID",
            "The body must be a JSON object.",
            problems=[Problem("", "expected an object")],
        )
    problems = storage_problems(document)
    if problems:
        raise ApiProblem(422, "BODY_INVALID", "The body cannot be stored.", problems=problems)
    if schema is not None:
        problems = shape_problems(document, schema)
        if problems:
            raise ApiProblem(
                422,
                "BODY_INVALID",
                "The body does not have the expected fields.",
                problems=problems,
            )
    return document


def shape_problems(document: Mapping[str, Any], schema: Mapping[str, Any]) -> list[Problem]:
    known = schema.get("properties", {})
    problems = [
        Problem(pointer((name,)), "unknown field") for name in document if name not in known
    ]
    validator = Draft202012Validator(schema)
    for error in validator.iter_errors(document):
        if error.validator == "additionalProperties" and not error.absolute_path:
            continue  # already reported field by field
        problems.append(Problem(pointer(error.absolute_path), error.message))
    return sorted(problems, key=lambda p: p.path)
