"""`orquestador flows dry-run` as a flow author runs it: a real process, a real API and worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.api.tokens import mint_token
from orquestador.worker.daemon import Worker
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.approval_support import approval_flow
from tests.integration.worker_support import ORG, publish_flow, settings

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "flows-cli-test-secret-" + "0123456789abcdef" * 3
DATA = '{"machineId": "m-1"}'


@pytest.fixture
def env(database: TestDatabase, runtime_engine: Engine) -> Iterator[dict[str, str]]:
    """The API on a loopback port and a worker, and the command's settings for an author."""
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn))
    worker = Worker(settings(database_url=database.runtime_dsn), runtime_engine, registry)
    with served_api(database, SECRET, registry=registry) as (url, configured):
        worker.start()
        try:
            scopes = ["flows:admin", "requests:read"]
            token = mint_token(configured, sub="author", org=ORG, scopes=scopes)
            yield {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}
        finally:
            worker.stop(timeout=30)


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "flows", "dry-run", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def _flow(runtime_engine: Engine) -> str:
    return str(publish_flow(runtime_engine, approval_flow()))


def test_a_rehearsed_rejection_runs_to_its_end_and_says_where(
    env: dict[str, str], runtime_engine: Engine
) -> None:
    outcomes = '{"ok": {"decision": "rejected"}}'
    done = _run(
        _flow(runtime_engine),
        "--transition",
        "ask",
        "--data",
        DATA,
        "--outcomes",
        outcomes,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split() == ["status", "SUCCEEDED"] for line in lines), done.stdout
    assert any(line.split() == ["to", "state", "refused"] for line in lines), done.stdout
    assert any("rehearsed: the decision rejected" in line for line in lines), done.stdout


@pytest.mark.parametrize(
    ("extra", "status", "said"),
    [
        (["--outcomes", '{"nope": {"error": "X"}}'], 1, "refused (422 OUTCOMES_INVALID)"),
        (["--outcomes", "{not json"], 2, "--outcomes is not valid JSON"),
        (["--outcomes", "@missing.json"], 2, "--outcomes: cannot read missing.json"),
    ],
)
def test_a_refused_or_unreadable_dry_run_says_why_and_exits_non_zero(
    env: dict[str, str], runtime_engine: Engine, extra: list[str], status: int, said: str
) -> None:
    done = _run(_flow(runtime_engine), "--transition", "ask", "--data", DATA, *extra, env=env)
    assert done.returncode == status
    assert said in done.stderr and "Traceback" not in done.stderr


def test_json_prints_the_execution_view(env: dict[str, str], runtime_engine: Engine) -> None:
    outcomes = '{"ok": {"deadline": true}}'
    args: list[Any] = [_flow(runtime_engine), "--transition", "ask", "--data", DATA]
    done = _run(*args, "--outcomes", outcomes, "--json", env=env)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert (view["status"], view["errorCode"]) == ("FAILED", "APPROVAL_DEADLINE_EXCEEDED")
