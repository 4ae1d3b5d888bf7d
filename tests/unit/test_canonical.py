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
