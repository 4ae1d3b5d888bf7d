"""JSON text as the product reads it from people and files: no NaN or Infinity.

PostgreSQL's jsonb refuses both, so a document that holds them is refused where it is
read (the API's bodies, the console's forms, `flows lint`, `flows apply`), not where it
is stored.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def parse_json(raw: str | bytes) -> Any:
    """JSON as the API reads it (no NaN or Infinity); ValueError when it is not JSON."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    # UnicodeDecodeError and JSONDecodeError are both ValueErrors.
