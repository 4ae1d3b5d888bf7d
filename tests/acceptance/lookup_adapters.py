"""A non-idempotent adapter that writes to the provider double by key, and looks writes up."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    Found,
    LookupResult,
    NotFound,
)

PROVIDER = os.environ.get("LOOKUP_PROVIDER_URL", "")


def _seconds_left(ctx: ActionContext) -> float:
    return max(0.05, ctx.seconds_left())


def write(ctx: ActionContext) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{PROVIDER}/writes",
        data=json.dumps(ctx.inputs).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.external_key,
            # Which worker process made the call: the test kills that one mid-call.
            "X-Worker-Pid": str(os.getpid()),
        },
    )
    with urllib.request.urlopen(request, timeout=_seconds_left(ctx)) as response:
        return json.loads(response.read())


def look_up(ctx: ActionContext) -> LookupResult:
    url = f"{PROVIDER}/writes/{quote(ctx.external_key, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=_seconds_left(ctx)) as response:
            return Found(json.loads(response.read()))
    except urllib.error.HTTPError as error:
        with error:
            if error.code == 404:
                return NotFound()
        raise


def register(registry: AdapterRegistry) -> None:
    registry.add(
        Adapter(
            capability="provider.write",
            version=1,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={
                "type": "object",
                "required": ["writeId"],
                "properties": {"writeId": {"type": "string"}},
            },
            timeout_seconds=2,
            # NotFound attempts count: room for a few kills of the same step.
            max_attempts=10,
            invoke=write,
            lookup=look_up,
            lookup_timeout_seconds=2,
        )
    )
