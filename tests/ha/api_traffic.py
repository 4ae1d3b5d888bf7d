"""Real API and worker processes on a URL of the test's choosing, and traffic through the API.

`Traffic` creates requests and accepts a transition of each, one after the other per
thread, and keeps every answer: the acknowledged acceptances (202, with their execution
ids) and every other status, with when it was sent and when it came back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from tests.ha.replication import ReplicatedPair, free_port, poll

ROOT = Path(__file__).resolve().parents[2]


def spawn(
    processes: list[subprocess.Popen], command: str, env: dict[str, str], log: Path
) -> subprocess.Popen:
    """`orquestador COMMAND` in a process group of its own, its output in LOG."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "orquestador.cli", command],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # gunicorn's workers go with their arbiter's group
        )
    processes.append(process)
    return process


def kill_groups(processes: list[subprocess.Popen]) -> None:
    """SIGKILL each process's group (gunicorn's workers go with their arbiter) and reap it."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def serve_api(
    processes: list[subprocess.Popen],
    env: dict[str, str],
    log: Path,
    workers: int,
    threads: int | None = None,
) -> str:
    """`orquestador api` (gunicorn) with the request and flow routes on a free port; its URL."""
    port = free_port()
    api_env = {
        **env,
        "API_PORT": str(port),
        "API_WORKERS": str(workers),
        "REQUEST_API_ENABLED": "true",
        "FLOW_ADMIN_ENABLED": "true",
    }
    if threads is not None:
        api_env["API_THREADS"] = str(threads)
    spawn(processes, "api", api_env, log)
    return f"http://127.0.0.1:{port}"


def token_for(secret: str) -> str:
    """A token for an operator of org `acme` who may publish flows and run requests."""
    return mint_token(
        Settings.from_env({}, jwt_secret=secret),
        sub="operator",
        org="acme",
        scopes=["flows:admin", "requests:read", "requests:write"],
        ttl_seconds=600,
    )


def api_ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Answer:
    sent: float  # time.monotonic() when the request left
    at: float  # when its answer arrived
    route: str
    status: int  # 0: no HTTP answer at all
    body: Any


@dataclass
class Traffic:
    """Requests created and transitions accepted through the API, one after the other."""

    base: str
    token: str
    flow_id: str
    transition: str
    answers: list[Answer] = field(default_factory=list)
    accepted: list[tuple[float, str]] = field(default_factory=list)  # (when, execution id)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            created = self.call("requests", {"flowId": self.flow_id, "data": {"n": n}})
            if created.status == 201:
                accepted = self.call(
                    f"requests/{created.body['id']}/transitions",
                    {"transition": self.transition, "expectedRevision": created.body["revision"]},
                )
                if accepted.status == 202:
                    self.accepted.append((accepted.at, accepted.body["executionId"]))
            self.stop.wait(0.02)  # a steady pace, not a synchronisation

    def call(self, path: str, body: dict[str, Any]) -> Answer:
        request = urllib.request.Request(
            f"{self.base}/api/v1/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        route = path.split("/")[-1] if "/" in path else path
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, kind = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, kind = error.code, error.read(), error.headers
        except OSError as error:
            status, raw, kind = 0, str(error).encode(), None
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        if kind is not None and status >= 400:
            document = parsed if isinstance(parsed, dict) else {"text": parsed}
            parsed = {"contentType": kind.get("Content-Type"), **document}
        answer = Answer(sent, time.monotonic(), route, status, parsed)
        self.answers.append(answer)
        return answer

    def accepted_after(self, moment: float) -> list[str]:
        return [execution for at, execution in list(self.accepted) if at > moment]


def traffic_through(base: str, secret: str, flow: dict[str, Any], transition: str) -> Traffic:
    """Traffic through the API at `base` once it is ready, on `flow` published through it."""
    poll(lambda: api_ready(base), timeout=60, what="the API to be ready")
    traffic = Traffic(base, token_for(secret), flow_id="", transition=transition)
    published = traffic.call("flows", flow)
    assert published.status == 201, published.body
    traffic.flow_id = published.body["id"]
    return traffic


def migrated(pair: ReplicatedPair, database: str, role: str) -> dict[str, str]:
    """The product's role, database and schema on the pair's primary, as its owner runs
    `orquestador migrate`; the environment the product's processes start from (no
    libpq PG* variable of the test run's own)."""
    pair.sql(pair.primary, f"CREATE ROLE {role} LOGIN")
    pair.sql(pair.primary, f"CREATE DATABASE {database}")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    done = subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "migrate"],
        cwd=ROOT,
        env={
            **base_env,
            "MIGRATION_DATABASE_URL": pair.primary.url(database),
            "RUNTIME_DATABASE_ROLE": role,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return base_env
