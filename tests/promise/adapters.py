"""The checker's adapters (ADAPTER_MODULES): one per effect class, calling the provider double.

Each call carries the step's external key, the planned case it belongs to and the
worker's pid, and the time it was sent, so the double's ledger can say who called,
for what, and when. The adapters do not honour their deadline on purpose: their HTTP
client waits CLIENT_TIMEOUT_SECONDS, longer than any adapter timeout, so a call the
engine abandoned at its deadline goes on in its thread and its write may still land.
That is the abandoned call SPEC section 15 is about.

Like any adapter they refuse to send once their attempt's deadline (`ctx.deadline`)
has passed, checked immediately before sending, and send it as `Request-Deadline`. A
case planned with a pause (`pauses.json` in the run folder) stops its worker process
with SIGSTOP right after that check, at its first call of the planned step, and a
detached `kill -CONT` wakes it the planned seconds later: a holder frozen (GC, VM)
past its lease, whose request leaves only once it wakes (SPEC section 25).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
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
    NotReady,
    PermanentError,
    TransientError,
    UncertainError,
    Unknown,
)
from orquestador.actions.contracts import RateLimit

PROVIDER_URL_ENV = "PROMISE_PROVIDER_URL"
RUN_FOLDER_ENV = "PROMISE_RUN_FOLDER"
PAUSES_FILE = "pauses.json"  # case -> {step: seconds}: the planned pauses before a send
CLIENT_TIMEOUT_SECONDS = 6.0
# Below the checker's worker lease (4 s), as the worker demands.
TIMEOUT_SECONDS = 1.0
MAX_ATTEMPTS = 3
# The keyed writes go through a rate limit, so its waits (no attempt spent, a held-back
# success written first) run under the same kills and restarts as everything else.
WRITES_RATE_LIMIT = RateLimit(per_second=2, burst=3)

READ = "promise.read"
PUT = "promise.put"
CHARGE = "promise.charge"
BLIND_CHARGE = "promise.blindcharge"

_INPUT = {
    "type": "object",
    "required": ["case"],
    "properties": {"case": {"type": "string"}, "slot": {"type": "string"}},
}


def _output(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": [name],
        "properties": {name: {"type": "string"}},
    }


def _provider() -> str:
    return os.environ[PROVIDER_URL_ENV]


def _headers(ctx: ActionContext) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Idempotency-Key": ctx.external_key,
        "Request-Deadline": ctx.deadline_text(),
        "X-Case": str(ctx.inputs.get("case", "")),
        # The concurrency key's value as this call sees it (the keyed flow's slot).
        "X-Slot": str(ctx.inputs.get("slot", "")),
        "X-Worker-Pid": str(os.getpid()),
        "X-Sent-At": f"{time.time():.6f}",
    }


def _pause_if_planned(ctx: ActionContext) -> None:
    """Freeze this whole process (every thread, the heartbeat's too) if the plan says so.

    Only the first call of the planned step pauses: the marker file's exclusive creation
    decides, whichever worker makes that call.
    """
    folder = os.environ.get(RUN_FOLDER_ENV)
    if not folder:
        return
    plan = json.loads((Path(folder) / PAUSES_FILE).read_text() or "{}")
    step = ctx.external_key.rsplit(":", 1)[-1]
    seconds = plan.get(str(ctx.inputs.get("case", "")), {}).get(step)
    if seconds is None:
        return
    marker = Path(folder) / f"paused-{ctx.external_key.replace(':', '-')}"
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w") as out:
        out.write(f"{time.time():.6f} {os.getpid()} {seconds} {ctx.external_key}\n")
    subprocess.Popen(
        ["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.kill(os.getpid(), signal.SIGSTOP)


def _send(ctx: ActionContext, route: str) -> dict[str, Any]:
    """POST to the double and turn its answer into the engine's terms."""
    ctx.check_deadline("the provider's request")
    _pause_if_planned(ctx)
    request = urllib.request.Request(
        f"{_provider()}/{route}",
        data=json.dumps(ctx.inputs).encode(),
        method="POST",
        headers=_headers(ctx),
    )
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_SECONDS) as response:
            body = json.loads(response.read())
            if response.status == 202:
                raise NotReady(float(body["checkAgainIn"]))
            return body
    except urllib.error.HTTPError as error:
        with error:
            body = json.loads(error.read() or b"{}")
            if error.code == 503:
                after = error.headers.get("Retry-After")
                raise TransientError(
                    "provider busy", retry_after=float(after) if after else None
                ) from None
            if error.code == 422:
                raise PermanentError(str(body.get("code", "DECLINED"))) from None
            raise UncertainError(f"provider answered {error.code}") from None


def _look_up(ctx: ActionContext, route: str) -> LookupResult:
    request = urllib.request.Request(
        f"{_provider()}/{route}/{quote(ctx.external_key, safe='')}", headers=_headers(ctx)
    )
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_SECONDS) as response:
            return Found(json.loads(response.read()))
    except urllib.error.HTTPError as error:
        with error:
            if error.code == 404:
                return NotFound()
            return Unknown()


def read(ctx: ActionContext) -> dict[str, Any]:
    return _send(ctx, "reads")


def put(ctx: ActionContext) -> dict[str, Any]:
    return _send(ctx, "writes")


def look_up_put(ctx: ActionContext) -> LookupResult:
    return _look_up(ctx, "writes")


def charge(ctx: ActionContext) -> dict[str, Any]:
    return _send(ctx, "charges")


def look_up_charge(ctx: ActionContext) -> LookupResult:
    return _look_up(ctx, "charges")


def register(registry: AdapterRegistry) -> None:
    common: dict[str, Any] = {
        "version": 1,
        "input_schema": _INPUT,
        "timeout_seconds": TIMEOUT_SECONDS,
        "max_attempts": MAX_ATTEMPTS,
    }
    registry.add(
        Adapter(
            capability=READ,
            effect=Effect.READ_ONLY,
            output_schema=_output("quote"),
            invoke=read,
            **common,
        )
    )
    registry.add(
        Adapter(
            capability=PUT,
            effect=Effect.IDEMPOTENT_WRITE,
            output_schema=_output("writeId"),
            invoke=put,
            lookup=look_up_put,
            rate_limit=WRITES_RATE_LIMIT,
            **common,
        )
    )
    registry.add(
        Adapter(
            capability=CHARGE,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            output_schema=_output("chargeId"),
            invoke=charge,
            lookup=look_up_charge,
            **common,
        )
    )
    registry.add(
        Adapter(
            capability=BLIND_CHARGE,
            effect=Effect.NON_IDEMPOTENT_WRITE,
            output_schema=_output("chargeId"),
            invoke=charge,
            **common,
        )
    )
