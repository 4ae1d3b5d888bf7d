"""Canonical JSON bytes and the input hash that checkpoints compare."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Serialize ``value`` so that equal JSON documents give equal bytes.

    Keys are sorted and no whitespace is written, so the bytes do not depend on
    dict insertion order. NaN and Infinity are rejected (``ValueError``): they
    are not JSON, and PostgreSQL's jsonb refuses them, so a hash over them could
    never be compared with a stored document.
    """
    text = json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return text.encode("utf-8")


def input_hash(value: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
