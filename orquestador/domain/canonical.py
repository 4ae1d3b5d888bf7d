"""Canonical JSON bytes and the input hash that checkpoints compare.

The bytes are RFC 8785 (the JSON Canonicalization Scheme): object keys sorted by
their UTF-16 code units, no whitespace, strings as UTF-8 with only the escapes
JSON requires, and numbers written as ECMAScript writes an IEEE-754 double.

Why numbers need a rule: a hash taken over an adapter's Python output on a first
run is compared, after a crash, with a hash over the same value read back from a
jsonb column. PostgreSQL keeps a JSON number as an exact decimal and writes it
back in its own way, and psycopg reads it with ``json.loads``: ``1e16`` comes back
as the int ``10000000000000000``, ``1e-7`` as ``0.0000001``, ``-0.0`` as ``0.0``,
while ``1.0`` stays the float ``1.0``. All forms of one number name the same
double, so every number is written as that double: ``1``, ``1.0`` and ``1e0``
all give ``1``; ``1e16`` and ``10000000000000000`` both give
``10000000000000000``; ``1e21`` gives ``1e+21``.

The rule for integers, stated once: an integer is hashed as the double nearest
to it. Below 2**53 that is the integer itself. Beyond it jsonb still keeps the
integer exactly and psycopg gives back the same int, but the hash sees only its
nearest double, so 2**53 and 2**53 + 1 hash alike. Writing large integers digit
for digit instead would break the round trip: the float ``1e300`` comes back
from jsonb as a 301-digit int and must hash as the float did. The stored value
and what an adapter receives stay exact; only the comparison is coarser. An
integer whose nearest double is infinite (more than 308 digits) is rejected with
``ValueError``, as NaN and Infinity are: no double carries it.

With that rule, ``canonical_json(v) == canonical_json(v')`` where ``v'`` is ``v``
written to a jsonb column and read back, for every value jsonb accepts (it
refuses NaN, Infinity and the character U+0000).
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

# Integers in this range are doubles exactly; rfc8785 writes them itself and
# refuses any other integer, which ``_as_doubles`` turns into its nearest double.
_EXACT_INT = 2**53 - 1


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value``, so that equal JSON documents give equal bytes.

    ``ValueError`` for numbers no double carries (NaN, Infinity, integers beyond
    the double range) and for text that is not UTF-8 (lone surrogates);
    ``TypeError`` for anything that is not JSON (a set, a non-string key, ...).
    """
    try:
        return rfc8785.dumps(_as_doubles(value))
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(str(exc)) from None


def input_hash(value: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _as_doubles(value: Any) -> Any:
    """``value`` with every integer beyond 2**53 replaced by its nearest double."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if -_EXACT_INT <= value <= _EXACT_INT:
            return value
        try:
            return float(value)
        except OverflowError:
            raise ValueError("an integer beyond the double range (about 1.8e308)") from None
    if isinstance(value, (list, tuple)):
        return [_as_doubles(item) for item in value]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"object keys are strings, not {type(key).__name__}")
        return {key: _as_doubles(item) for key, item in value.items()}
    raise TypeError(f"{type(value).__name__} is not JSON")
