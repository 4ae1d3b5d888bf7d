"""Canonical JSON and input hashes, and the purity rule of the domain package."""

import ast
import hashlib
import math
from pathlib import Path

import pytest

from orquestador.domain.canonical import canonical_json, input_hash


def test_equal_documents_give_equal_bytes_whatever_the_key_order():
    left = {"b": [1, {"y": 2, "x": 1}], "a": "z"}
    right = {"a": "z", "b": [1, {"x": 1, "y": 2}]}
    assert canonical_json(left) == canonical_json(right)
    assert canonical_json(left) == b'{"a":"z","b":[1,{"x":1,"y":2}]}'


def test_non_ascii_text_is_written_as_utf8_not_escaped():
    assert canonical_json({"nome": "ação"}) == '{"nome":"ação"}'.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_numbers_json_cannot_carry_are_rejected(number):
    with pytest.raises(ValueError):
        canonical_json({"x": number})


@pytest.mark.parametrize(
    ("forms", "written"),
    [
        ((1, 1.0, 1e0), b"1"),
        ((10**16, 1e16, 10000000000000000.0), b"10000000000000000"),
        ((10**21, 1e21), b"1e+21"),
        ((1e-7, 0.0000001), b"1e-7"),
        ((0.000001,), b"0.000001"),
        ((0, 0.0, -0.0), b"0"),
        ((-2.5, -2.50), b"-2.5"),
        ((10**300, 1e300), b"1e+300"),
    ],
)
def test_every_form_of_a_number_is_written_as_ecmascript_writes_its_double(forms, written):
    assert {canonical_json(form) for form in forms} == {written}


def test_integers_beyond_2_to_the_53_are_hashed_as_their_nearest_double():
    assert canonical_json(2**53 - 1) == b"9007199254740991"
    assert canonical_json(2**53 + 1) == canonical_json(2**53) == b"9007199254740992"
    assert canonical_json(-(2**53) - 1) == b"-9007199254740992"
    assert canonical_json([2**64]) == canonical_json([float(2**64)]) == b"[18446744073709552000]"


def test_an_integer_no_double_can_carry_is_rejected():
    with pytest.raises(ValueError):
        canonical_json({"x": 10**400})


def test_keys_sort_by_utf16_code_units_as_rfc_8785_says():
    # U+1F600 is a surrogate pair (0xD83D ...) in UTF-16, so it sorts before U+FF21.
    assert canonical_json({"\uff21": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\uff21":1}'.encode()


def test_strings_escape_only_what_json_requires():
    assert canonical_json('a"\\\n\u0001/é') == b'"a\\"\\\\\\n\\u0001/\xc3\xa9"'


@pytest.mark.parametrize("value", [{1: "a"}, {"x": {1, 2}}, b"bytes", object()])
def test_what_is_not_json_is_a_type_error(value):
    with pytest.raises(TypeError):
        canonical_json(value)


def test_text_that_is_not_utf8_is_rejected():
    with pytest.raises(ValueError):
        canonical_json("lone \ud800 surrogate")


def test_input_hash_is_the_sha256_of_the_canonical_bytes():
    assert input_hash({"b": 1, "a": 2}) == hashlib.sha256(b'{"a":2,"b":1}').hexdigest()
    assert input_hash({"a": 1}) != input_hash({"a": "1"})


_FORBIDDEN = ("orquestador.db", "orquestador.api", "orquestador.worker", "orquestador.queue")
_FORBIDDEN += ("orquestador.actions", "sqlalchemy", "psycopg", "flask", "requests")


def test_domain_package_imports_no_io_layer():
    domain = Path(__file__).resolve().parents[2] / "orquestador" / "domain"
    offenders = []
    for source in sorted(domain.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [
                f"{source.name}: {name}"
                for name in names
                if any(name == f or name.startswith(f + ".") for f in _FORBIDDEN)
            ]
    assert offenders == []
