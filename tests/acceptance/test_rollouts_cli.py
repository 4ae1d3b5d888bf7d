"""`orquestador rollouts` as an operator runs it: a real process, a real API and worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine

from orquestador.api.tokens import mint_token
from orquestador.client import Client
from orquestador.worker.daemon import Worker
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.rollout_support import (
    PatchProvider,
    child_flow,
    children,
    parent_flow,
    rollout_registry,
)
from tests.integration.worker_support import ORG, settings, status_is, wait_until

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "rollouts-cli-test-secret-" + "0123456789abcdef" * 3


@dataclass
class Served:
    alice: Client  # publishes the flows and starts the rollouts
    operator_env: dict[str, str]  # olga's settings for the command
    provider: PatchProvider


@pytest.fixture
def served(database: TestDatabase, runtime_engine: Engine) -> Iterator[Served]:
    provider = PatchProvider(seconds=0.5)
    registry = rollout_registry(database, provider)
    # A failing child's three attempts retry within a second, not within eight.
    quick_retries = settings(
        database_url=database.runtime_dsn, retry_base_seconds=0.1, retry_cap_seconds=0.4
    )
    worker = Worker(quick_retries, runtime_engine, registry)
    with served_api(database, SECRET, registry=registry) as (url, configured):
        worker.start()
        try:
            alice = ["flows:admin", "requests:write", "requests:read"]
            client = Client(url, mint_token(configured, sub="alice", org=ORG, scopes=alice))
            olga = ["executions:cancel", "executions:reconcile", "requests:read-all"]
            token = mint_token(configured, sub="olga", org=ORG, scopes=olga)
            env = {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}
            yield Served(client, env, provider)
        finally:
            worker.stop(timeout=30)


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "rollouts", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run_executions(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "executions", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _start(client: Client, machines: list[str], **rollout: object) -> str:
    child = child_flow()
    client.publish_flow(child)
    parent = parent_flow(child["key"], **rollout)
    client.publish_flow(parent)
    return client.start_run(parent["key"], "go", {"machines": machines})["executionId"]


def test_an_operator_pauses_resumes_and_cancels_a_rollout(
    served: Served, runtime_engine: Engine
) -> None:
    execution_id = _start(served.alice, [f"m-{n}" for n in range(30)], batch=1)
    wait_until(lambda: len(children(runtime_engine, execution_id)) >= 1, what="a child started")

    paused = _run("pause", execution_id, "--reason", "error rate up", env=served.operator_env)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("rollout paused:")
    shown = _run("show", execution_id, env=served.operator_env)
    assert shown.returncode == 0 and "rollout paused" in shown.stdout
    assert "failures 0 of 0 allowed" in shown.stdout

    resumed = _run("resume", execution_id, env=served.operator_env)
    assert resumed.returncode == 0 and resumed.stdout.startswith("rollout running:")

    no_reason = _run("cancel", execution_id, env=served.operator_env)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    cancelled = _run("cancel", execution_id, "--reason", "bad patch", env=served.operator_env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("rollout cancelled:")
    wait_until(status_is(runtime_engine, execution_id, "FAILED"), timeout=30)
    assert len(children(runtime_engine, execution_id)) < 30

    ended = _run("resume", execution_id, env=served.operator_env)
    assert ended.returncode == 1
    assert "ROLLOUT_ENDED" in ended.stdout + ended.stderr
    assert "Traceback" not in ended.stderr


def test_an_operator_retries_the_failed_children(served: Served, runtime_engine: Engine) -> None:
    served.provider.seconds = 0.0
    served.provider.failing = frozenset({"m-2"})
    execution_id = _start(served.alice, ["m-1", "m-2", "m-3"], batch=3, maxFailures=1)
    wait_until(status_is(runtime_engine, execution_id, "SUCCEEDED"), timeout=30)
    served.provider.failing = frozenset()

    listed = _run_executions("list", "--parent", execution_id[:8], env=served.operator_env)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert sorted(row.split()[0] for row in rows) == sorted(
        str(c.id) for c in children(runtime_engine, execution_id)
    )
    assert {row.split()[1] for row in rows} == {"SUCCEEDED", "FAILED"}

    retried = _run("retry-failed", execution_id, env=served.operator_env)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.startswith("retrying 1 failed item(s): execution ")
    again = retried.stdout.split("execution ")[1].split()[0]
    wait_until(status_is(runtime_engine, again, "SUCCEEDED", "FAILED"), timeout=60)
    from tests.integration.worker_support import execution

    row = execution(runtime_engine, again)
    assert row.status == "SUCCEEDED", (
        row.error_code,
        row.error_detail,
        children(runtime_engine, again),
    )
    assert [c.machine_id for c in children(runtime_engine, again)] == ["m-2"]

    unknown = _run("pause", "not-an-id", env=served.operator_env)
    assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
