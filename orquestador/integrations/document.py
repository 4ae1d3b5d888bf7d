"""The fixed contract of `document.verify@1`: the product owns the schemas, the operator the URL."""

from __future__ import annotations

from typing import Any

CAPABILITY = "document.verify"
VERSION = 1

DOCUMENT_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["documentType", "documentNumber", "country"],
    "additionalProperties": False,
    "properties": {
        "documentType": {"type": "string", "minLength": 1, "maxLength": 64},
        "documentNumber": {"type": "string", "minLength": 1, "maxLength": 128},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
        "holderName": {"type": "string", "maxLength": 256},
    },
}

DOCUMENT_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["status", "reasons", "reference"],
    "properties": {
        "status": {"enum": ["VERIFIED", "REJECTED", "INCONCLUSIVE"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "reference": {"type": "string"},
    },
}


def is_document_verify(capability: str, version: int) -> bool:
    return (capability, version) == (CAPABILITY, VERSION)
