"""OpenAPI paths and schemas of the machine agent API (/agent/...)."""

from __future__ import annotations

from typing import Any

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {}


def paths() -> dict[str, Any]:
    return {}
