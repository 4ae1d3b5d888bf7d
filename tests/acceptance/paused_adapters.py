"""A non-idempotent charge whose worker a test can freeze between its last look at the
deadline and the moment its request leaves (the window no adapter can close)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
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

PROVIDER = os.environ.get("PAUSE_PROVIDER_URL", "")
# Set for the worker the test freezes: its call says where it is, then waits for `go`.
PAUSE_DIR = os.environ.get("PAUSE_AT_SEND_DIR", "")
TIMEOUT_SECONDS = 2.0


def _at_send() -> None:
    if not PAUSE_DIR:
        return
    folder = Path(PAUSE_DIR)
    (folder / f"{os.getpid()}.at-send").write_text("")
    # The test stops this process (SIGSTOP) here, writes `go`, and lets it go on later.
    while not (folder / "go").exists():
        time.sleep(0.01)


def charge(ctx: ActionContext) -> dict[str, Any]:
    ctx.check_deadline("the charge")  # the adapter's last look at its deadline
    _at_send()
    request = urllib.request.Request(
        f"{PROVIDER}/charges",
        data=json.dumps(ctx.inputs).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.external_key,
            "X-Worker-Pid": str(os.getpid()),
        },
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def look_up(ctx: ActionContext) -> LookupResult:
    url = f"{PROVIDER}/charges/{quote(ctx.external_key, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=max(0.05, ctx.seconds_left())) as response:
            return Found(json.loads(response.read()))
    except urllib.error.HTTPError as error:
        with error:
            if error.code == 404:
                return NotFound()
        raise


def register(registry: AdapterRegistry) -> None:
    registry.add(
        Adapter(
            capability="provider.charge",
            version=1,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            input_schema={"type": "object"},
            output_schema={
                "type": "object",
                "required": ["chargeId"],
                "properties": {"chargeId": {"type": "string"}},
            },
            timeout_seconds=TIMEOUT_SECONDS,
            max_attempts=3,
            invoke=charge,
            lookup=look_up,
            lookup_timeout_seconds=2,
        )
    )
