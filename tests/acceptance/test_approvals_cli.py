"""`orquestador approvals` as an approver runs it: a real process, a real API and worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.api.tokens import mint_token
from orquestador.client import Client
from orquestador.worker.daemon import Worker
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.approval_support import approval_flow
from tests.integration.worker_support import ORG, settings

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "approvals-cli-test-secret-" + "0123456789abcdef" * 3


@dataclass
class Served:
    requester: Client  # alice: publishes the flow and asks for the transition
    approver_env: dict[str, str]  # bob's settings for the command


@pytest.fixture
def served(database: TestDatabase, runtime_engine: Engine) -> Iterator[Served]:
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn))
    worker = Worker(settings(database_url=database.runtime_dsn), runtime_engine, registry)
    with served_api(database, SECRET, registry=registry) as (url, configured):
        worker.start()
        try:
            alice = ["flows:admin", "requests:write", "requests:read"]
            requester = Client(url, mint_token(configured, sub="alice", org=ORG, scopes=alice))
            bob = mint_token(configured, sub="bob", org=ORG, scopes=["approvals:decide"])
            yield Served(requester, {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": bob})
        finally:
            worker.stop(timeout=30)


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "approvals", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _waiting_for_approval(client: Client) -> str:
    """Start the flow's `ask`, and the execution's id once its approval is open."""
    flow = approval_flow()
    flow["dataSchema"]["properties"]["reason"] = {"type": "string"}
    flow["transitions"][0]["actions"][0]["input"]["title"] = {
        "format": "Reboot {/data/machineId}: {/data/reason}"
    }
    client.publish_flow(flow)
    started = client.start_run("reboot", "ask", {"machineId": "m-1", "reason": "kernel update"})
    execution_id = started["executionId"]
    view = client.wait_execution(execution_id, 30)
    assert view.get("waitingForApproval"), f"the approval did not open within 30 s: {view}"
    return execution_id


def test_an_approver_lists_decides_once_and_is_refused_the_second_time(served: Served) -> None:
    execution_id = _waiting_for_approval(served.requester)

    listed = _run("list", env=served.approver_env)
    header, row = listed.stdout.splitlines()
    approval_id = row.split()[0]
    decided = _run("decide", approval_id, "approve", "--comment", "ok", env=served.approver_env)
    again = _run("decide", approval_id, "reject", env=served.approver_env)
    closed = _run("list", "--status", "closed", env=served.approver_env)

    assert header.split() == [
        "ID",
        "STATUS",
        "DEADLINE",
        "FLOW",
        "AND",
        "TRANSITION",
        "MACHINE",
        "ASKED",
        "BY",
        "WHAT",
    ]
    # What it approves: the flow and transition that ask, the machine, who asked, and
    # the title the flow formats from the request's data.
    assert row.split()[1:2] + row.split()[3:8] == ["open", "reboot", "v1", "ask", "m-1", "alice"]
    assert row.endswith("Reboot m-1: kernel update")
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout == f"approved by bob; execution {execution_id} goes on\n"
    assert again.returncode == 1
    assert again.stderr.startswith("orquestador: refused (409 APPROVAL_CLOSED)")
    assert closed.stdout.splitlines()[1].split()[:2] == [approval_id, "approved"]
    assert _run("list", env=served.approver_env).stdout == "no open approvals name you\n"
