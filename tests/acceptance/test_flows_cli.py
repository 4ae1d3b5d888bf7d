"""`orquestador flows dry-run` as a flow author runs it: a real process, a real API and worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

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


def _flows(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "flows", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_a_dry_run_names_its_flow_by_key(env: dict[str, str], runtime_engine: Engine) -> None:
    _flow(runtime_engine)

    done = _run("reboot", "--transition", "ask", "--data", DATA, "--json", env=env)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["flowKey"] == "reboot"


def test_flows_list_and_show_name_keys_versions_and_ids(
    env: dict[str, str], runtime_engine: Engine
) -> None:
    first = _flow(runtime_engine)
    with runtime_engine.begin() as connection:
        second = connection.execute(
            text(
                "INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,"
                " created_by) SELECT org_id, key, 2, trigger, definition, data_schema,"
                " 'author' FROM flow WHERE id = :id RETURNING id"
            ),
            {"id": first},
        ).scalar_one()

    listed = _flows("list", env=env)
    shown = _flows("show", "reboot", env=env)
    older = _flows("show", first, env=env)
    missing = _flows("show", "nothing-here", env=env)

    assert listed.returncode == 0, listed.stderr
    rows = [line.split()[:3] for line in listed.stdout.splitlines()[1:]]
    assert rows == [["reboot", "2", str(second)], ["reboot", "1", first]]
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines()[:3])
    assert fields == {"flow": "reboot v2", "id": str(second), "latest": "yes"}
    assert "start it: orquestador run reboot ask --data JSON [--wait]" in shown.stdout
    assert dict(line.split(None, 1) for line in older.stdout.splitlines()[:3])["latest"] == (
        "no: v2 is"
    )
    assert missing.returncode == 1 and "refused (404 NOT_FOUND)" in missing.stderr
