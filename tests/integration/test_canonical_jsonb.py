"""A hash taken before a value is stored equals the hash of what jsonb gives back."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Engine, Integer, MetaData, Table, insert, select
from sqlalchemy.dialects.postgresql import JSONB

from orquestador.domain.canonical import canonical_json, input_hash

# jsonb refuses U+0000, and a lone surrogate is not text: neither can be stored.
_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)

_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**64), max_value=2**64),
    # The largest integers a double still carries (about 1.8e308).
    st.integers(min_value=-(10**308), max_value=10**308),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-5, max_value=1e-5, allow_nan=False),
    st.floats(min_value=1e15, max_value=1e22, allow_nan=False, allow_infinity=False),
)

_JSON = st.recursive(
    st.none() | st.booleans() | _NUMBERS | _TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=20,
)

_roundtrip = Table(
    "canonical_roundtrip",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("doc", JSONB, nullable=False),
    prefixes=["TEMPORARY"],
)


def test_hash_survives_a_round_trip_through_a_jsonb_column(owner_engine: Engine) -> None:
    # A temporary table lives in one connection, so every example reuses this one.
    with owner_engine.connect() as connection:
        _roundtrip.create(connection)

        @settings(max_examples=4 * settings.default.max_examples, deadline=None)
        @given(_JSON)
        @example(1e16)
        @example({"big": 10**16, "small": 1e-7, "zero": -0.0, "one": 1.0})
        @example([2**53 + 1, -(2**63), 1e21, 5e-324, 1.7976931348623157e308])
        @example({"nome": "ação", "emoji": "\U0001f600", "ctl": '\n\u0001"'})
        def check(value: Any) -> None:
            row_id = connection.execute(
                insert(_roundtrip).values(doc=value).returning(_roundtrip.c.id)
            ).scalar_one()
            stored = connection.execute(
                select(_roundtrip.c.doc).where(_roundtrip.c.id == row_id)
            ).scalar_one()
            assert canonical_json(stored) == canonical_json(value)
            assert input_hash(stored) == input_hash(value)

        check()
