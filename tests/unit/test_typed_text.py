"""A correction's value typed as text: the data schema at its path decides how it reads."""

from __future__ import annotations

from typing import Any

import pytest

from orquestador.domain.typed_text import TextNotUnderstood, value_from_text

SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {"plan": {"enum": ["basic", "large"]}},
    "properties": {
        "plan": {"$ref": "#/$defs/plan"},
        "note": {"type": ["string", "null"]},
        "seats": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "anything": {},
    },
}


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("large", "/plan", "large"),
        ('"large"', "/plan", "large"),
        ("by phone", "/note", "by phone"),
        ("null", "/note", None),
        ("950", "/note", "950"),  # a text field keeps digits as text
        ("5", "/seats", 5),
        ("red", "/tags/0", "red"),
        ('["a"]', "/tags", ["a"]),
        ('{"x": 1}', "/anything", {"x": 1}),
        ('"quoted"', "/missing", "quoted"),
    ],
)
def test_text_reads_as_the_schema_at_its_path_says(text: str, path: str, value: Any) -> None:
    assert value_from_text(text, SCHEMA, path) == value


@pytest.mark.parametrize(
    ("text", "path", "said"),
    [
        ("many", "/seats", '/seats takes a whole number such as 950, not the text "many"'),
        ("red", "/anything", 'give it as JSON, text in quotes, e.g. "red"'),
        ("red", "/missing", 'give it as JSON, text in quotes, e.g. "red"'),
    ],
)
def test_text_the_schema_cannot_place_is_refused_saying_how_to_write_it(
    text: str, path: str, said: str
) -> None:
    with pytest.raises(TextNotUnderstood) as refused:
        value_from_text(text, SCHEMA, path)

    assert refused.value.code == "CORRECTION_INVALID"
    assert said in refused.value.message
