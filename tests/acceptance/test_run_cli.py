"""`orquestador run` and `orquestador executions wait` as an on-call operator runs them: a
real process, a real API and a worker, and the exit status that says how it ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.api.tokens import mint_token
from orquestador.client import Client
from orquestador.config import Settings
from orquestador.worker.daemon import Worker
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.approval_support import approval_flow
from tests.integration.worker_support import ORG, action, flow_definition, publish_flow, settings

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "run-cli-test-secret-" + "0123456789abcdef" * 3


@dataclass
class Served:
    url: str
    settings: Settings
    env: dict[str, str]

    def client(self, sub: str, scopes: list[str]) -> Client:
        return Client(self.url, mint_token(self.settings, sub=sub, org=ORG, scopes=scopes))


@pytest.fixture
def served(database: TestDatabase, runtime_engine: Engine) -> Iterator[Served]:
    """The API on a loopback port and a worker, and the command's settings for an operator."""
    registry = AdapterRegistry()
    register_builtins(registry, settings(database_url=database.runtime_dsn))
    worker = Worker(settings(database_url=database.runtime_dsn), runtime_engine, registry)
    with served_api(database, SECRET, registry=registry) as (url, configured):
        worker.start()
        try:
            scopes = ["requests:write", "requests:read"]
            token = mint_token(configured, sub="oncall", org=ORG, scopes=scopes)
            yield Served(url, configured, {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token})
        finally:
            worker.stop(timeout=30)


def orquestador(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def published(runtime_engine: Engine, definition: dict[str, Any]) -> str:
    publish_flow(runtime_engine, definition)
    return definition["key"]


def choosing() -> dict[str, Any]:
    """A flow whose table has a rule for "ok" only: anything else ends FAILED, nothing written."""
    return flow_definition(
        [],
        decision={
            "hitPolicy": "FIRST",
            "inputs": ["/data/choice"],
            "rules": [{"id": "ok", "when": ['"ok"'], "then": {"to": "done"}}],
        },
    )


def started_id(stdout: str) -> str:
    line = next(line for line in stdout.splitlines() if line.startswith("started: "))
    return line.split()[2]


def test_a_run_by_key_is_followed_until_it_succeeds_and_exits_0(
    served: Served, runtime_engine: Engine
) -> None:
    key = published(runtime_engine, choosing())

    done = orquestador("run", key, "go", "--data", '{"choice": "ok"}', "--wait", env=served.env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert started_id(done.stdout)
    lines = done.stdout.splitlines()
    assert any(line.split() == ["status", "SUCCEEDED"] for line in lines), done.stdout
    assert "succeeded: the request is now in state done" in done.stdout


def test_a_run_that_fails_exits_1_and_says_why(served: Served, runtime_engine: Engine) -> None:
    key = published(runtime_engine, choosing())

    done = orquestador("run", key, "go", "--data", '{"choice": "no"}', "--wait", env=served.env)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: NO_RULE_MATCHED" in done.stdout


def test_a_run_waiting_for_an_approval_exits_3_and_a_wait_follows_it_after_the_decision(
    served: Served, runtime_engine: Engine
) -> None:
    key = published(runtime_engine, approval_flow())

    asked = orquestador(
        "run", key, "ask", "--data", '{"machineId": "m-1"}', "--wait", env=served.env
    )

    assert asked.returncode == 3, asked.stdout + asked.stderr
    execution_id = started_id(asked.stdout)
    approval = served.client("oncall", ["requests:read"]).get_execution(execution_id)[
        "waitingForApproval"
    ]
    assert f"orquestador approvals decide {approval} approve|reject" in asked.stdout
    served.client("bob", ["approvals:decide"]).decide_approval(approval, "approved")

    followed = orquestador("executions", "wait", execution_id[:8], "--json", env=served.env)

    assert followed.returncode == 0, followed.stdout + followed.stderr
    view = json.loads(followed.stdout)
    assert (view["status"], view["toState"]) == ("SUCCEEDED", "rebooting")


def test_a_run_still_moving_when_its_time_is_up_exits_4(
    served: Served, runtime_engine: Engine
) -> None:
    # A reboot nobody's agent takes: the wait for it goes on past the command's patience.
    waits = flow_definition(
        [
            action(
                "send",
                "machine.command",
                input={"machineId": {"const": "m-1"}, "command": {"const": "reboot"}},
            ),
            action(
                "wait",
                "machine.wait",
                input={
                    "commandId": {"from": "/actions/send/commandId"},
                    "deadlineSeconds": {"const": 600},
                },
            ),
        ]
    )
    key = published(runtime_engine, waits)

    done = orquestador("run", key, "go", "--data", "{}", "--wait", "--timeout", "1", env=served.env)

    assert done.returncode == 4, done.stdout + done.stderr
    assert "after 1 s: follow it with orquestador executions wait" in done.stdout


def test_without_wait_the_run_is_started_and_named(served: Served, runtime_engine: Engine) -> None:
    key = published(runtime_engine, choosing())

    done = orquestador(
        "run", key, "go", "--data", "{}", "--priority", "8", "--json", env=served.env
    )

    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout)
    assert (started["flowKey"], started["flowVersion"]) == (key, 1)
    with runtime_engine.connect() as connection:
        priority = connection.execute(
            text("SELECT priority FROM execution WHERE id = :id"), {"id": started["executionId"]}
        ).scalar_one()
    assert priority == 8


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["no-such-flow", "go", "--data", "{}"], "refused (422 FLOW_UNKNOWN)"),
        (["KEY", "nope", "--data", "{}", "--wait"], "refused (422 TRANSITION_UNKNOWN)"),
        (["KEY", "go", "--data", "{not json"], "--data is not valid JSON"),
        (["KEY", "go", "--data", "[1]"], "--data must be a JSON object"),
        (["KEY", "go", "--data", "@missing.json"], "--data: cannot read missing.json"),
        (["KEY", "go", "--data", "{}", "--priority", "10"], "expected a whole number from 0 to 9"),
        (["KEY", "go", "--data", "{}", "--timeout", "5"], "--timeout goes with --wait"),
    ],
    ids=["flow", "transition", "json", "not-object", "file", "priority", "timeout"],
)
def test_a_refused_run_or_bad_input_exits_2_with_one_line(
    served: Served, runtime_engine: Engine, args: list[str], said: str
) -> None:
    key = published(runtime_engine, choosing())

    done = orquestador("run", *[key if a == "KEY" else a for a in args], env=served.env)

    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_waiting_on_a_parked_execution_exits_3_and_names_the_evidence(
    served: Served, runtime_engine: Engine, owner_engine: Engine
) -> None:
    key = published(runtime_engine, approval_flow())
    started = orquestador("run", key, "ask", "--data", "{}", "--json", env=served.env)
    execution_id = json.loads(started.stdout)["executionId"]
    with owner_engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE execution SET status = 'RECONCILIATION_REQUIRED',"
                " error_code = 'UNCERTAIN_OUTCOME', lease_owner = NULL,"
                " lease_expires_at = NULL WHERE id = :id"
            ),
            {"id": execution_id},
        )

    done = orquestador("executions", "wait", execution_id, env=served.env)

    assert done.returncode == 3, done.stdout + done.stderr
    assert f"see orquestador executions evidence {execution_id}" in done.stdout


def test_waiting_on_an_execution_nobody_may_see_exits_2(served: Served) -> None:
    done = orquestador("executions", "wait", "0b6c7d8e-0000-4000-8000-000000000001", env=served.env)

    assert done.returncode == 2
    assert "refused (404 NOT_FOUND)" in done.stderr


def test_a_run_that_continues_by_itself_is_followed_to_its_end(
    served: Served, runtime_engine: Engine
) -> None:
    chained = flow_definition([], to="ready", states=("new", "ready", "done"))
    chained["transitions"].append({"id": "finish", "from": ["ready"], "actions": [], "to": "done"})
    chained["continue"] = {"ready": "finish"}
    key = published(runtime_engine, chained)

    done = orquestador("run", key, "go", "--data", "{}", "--wait", env=served.env)

    assert done.returncode == 0, done.stdout + done.stderr
    first = started_id(done.stdout)
    continued = next(line for line in done.stdout.splitlines() if line.startswith("continued: "))
    assert continued.startswith(f"continued: execution {first} ended in ready, which continues")
    assert "succeeded: the request is now in state done" in done.stdout
    assert any(line.split() == ["transition", "finish"] for line in done.stdout.splitlines())
