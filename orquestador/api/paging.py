"""Keyset pages of the listing routes: the opaque cursor and the query problem they answer."""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from orquestador.api.problems import ApiProblem
from orquestador.errors import Problem

# A cursor this API hands out is well under this; anything longer is refused unread.
MAX_CURSOR_CHARACTERS = 200


def query_problem(name: str, message: str) -> ApiProblem:
    """400 QUERY_INVALID naming the parameter."""
    return ApiProblem(
        400,
        "QUERY_INVALID",
        "A query parameter is invalid.",
        problems=[Problem(f"/{name}", message)],
    )


def cursor(row: Any) -> str:
    """Opaque to clients: where the page ended, as (created_at, id)."""
    raw = f"{row.created_at.isoformat()}|{row.id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def read_cursor(text: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) a cursor holds; 400 for anything this API did not hand out."""
    try:
        if len(text) > MAX_CURSOR_CHARACTERS:
            raise ValueError("too long")
        padded = text.encode("ascii") + b"=" * (-len(text) % 4)
        created, separator, identifier = (
            base64.urlsafe_b64decode(padded).decode("utf-8").partition("|")
        )
        at = datetime.fromisoformat(created)
        if not separator or at.tzinfo is None:
            raise ValueError("not a cursor")
        return at.astimezone(UTC), uuid.UUID(identifier)
    except (ValueError, binascii.Error, OverflowError):
        raise query_problem("after", "not a cursor this API handed out") from None


def page_limit(args: Mapping[str, str], default: int, maximum: int) -> int:
    """The `limit` query parameter: a whole number from 1 to `maximum`, else `default`."""
    text = args.get("limit")
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,4}", text) or not 1 <= int(text) <= maximum:
        raise query_problem("limit", f"a whole number from 1 to {maximum}")
    return int(text)
