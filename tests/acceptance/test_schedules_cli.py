"""`orquestador schedules` as an operator runs it: a real process against a real API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from orquestador.api.tokens import mint_token
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.schedule_support import schedule_flow
from tests.integration.worker_support import ORG, publish_flow

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "schedules-cli-test-secret-" + "0123456789abcdef" * 3


@pytest.fixture
def env(database: TestDatabase) -> Iterator[dict[str, str]]:
    """The API on a loopback port, and the command's settings for a plans:admin caller."""
    with served_api(database, SECRET) as (url, settings):
        token = mint_token(settings, sub="ops", org=ORG, scopes=["plans:admin"])
        yield {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}


def _run(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "schedules", *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_put_show_list_and_delete_a_schedule(env: dict[str, str], owner_engine) -> None:
    flow_id = str(publish_flow(owner_engine, schedule_flow()))

    put = _run(
        "put", "nightly", "--flow", flow_id, "--cron", "30 2 * * *",
        "--timezone", "Europe/Madrid", "--catch-up", "one", "--data", '{"report": "r"}',
        env=env,
    )  # fmt: skip
    shown = _run("show", "nightly", env=env)
    shown_json = _run("show", "nightly", "--json", env=env)
    listed = _run("list", env=env)

    assert put.returncode == 0, put.stderr
    assert "when        30 2 * * *" in put.stdout
    assert shown.returncode == 0 and "catch-up    one" in shown.stdout
    view = json.loads(shown_json.stdout)
    assert (view["timezone"], view["data"], view["missed"]) == ("Europe/Madrid", {"report": "r"}, 0)
    header, row = listed.stdout.splitlines()
    assert header.split()[:4] == ["ID", "WHEN", "TIMEZONE", "CATCH-UP"]
    assert row.startswith("nightly  30 2 * * *  Europe/Madrid  one")

    paused = _run("put", "nightly", "--flow", flow_id, "--every", "60", "--paused", env=env)
    assert paused.returncode == 0 and "next fire   -" in paused.stdout

    deleted = _run("delete", "nightly", env=env)
    assert deleted.returncode == 0 and deleted.stdout == "schedule nightly deleted\n"
    gone = _run("show", "nightly", env=env)
    assert gone.returncode == 1
    assert gone.stderr.startswith("orquestador: refused (404 NOT_FOUND)")


def test_refusals_are_one_problem_and_a_non_zero_exit(env: dict[str, str], owner_engine) -> None:
    flow_id = str(publish_flow(owner_engine, schedule_flow()))

    bad_cron = _run("put", "s", "--flow", flow_id, "--cron", "* * * *", env=env)
    assert bad_cron.returncode == 1
    assert "Traceback" not in bad_cron.stderr
    assert bad_cron.stderr.splitlines()[0].startswith("orquestador: refused (422 SCHEDULE_INVALID)")
    assert "  /cron: a cron expression has five fields" in bad_cron.stderr

    bad_zone = _run("put", "s", "--flow", flow_id, "--every", "5", "--timezone", "Nowhere", env=env)
    assert bad_zone.returncode == 1 and "/timezone: unknown time zone" in bad_zone.stderr

    both = _run("put", "s", "--flow", flow_id, "--every", "5", "--cron", "* * * * *", env=env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr

    bad_json = _run("put", "s", "--flow", flow_id, "--every", "5", "--data", "{", env=env)
    assert bad_json.returncode == 2
    assert bad_json.stderr.startswith("orquestador: --data is not valid JSON")

    no_token = _run("list", env={"ORQUESTADOR_API_URL": env["ORQUESTADOR_API_URL"]}, cwd=Path("/"))
    assert no_token.returncode == 2 and "ORQUESTADOR_TOKEN" in no_token.stderr


def test_a_manual_flow_is_scheduled_by_key_and_run_now(env: dict[str, str], owner_engine) -> None:
    publish_flow(owner_engine, schedule_flow(key="reboot", trigger="manual", start=None))

    put = _run(
        "put", "weekly", "--flow", "reboot", "--transition", "run", "--every", "3600",
        "--data", '{"scheduleId": "x", "fireTime": "y", "data": {"machineId": "m-2"}}',
        env=env,
    )  # fmt: skip
    ran = _run("run", "weekly", "--json", env=env)
    missing = _run("run", "nope", env=env)

    assert put.returncode == 0, put.stderr
    assert "flow        reboot" in put.stdout and "transition  run" in put.stdout
    assert ran.returncode == 0, ran.stderr
    fired = json.loads(ran.stdout)
    assert fired["scheduleId"] == "weekly" and fired["executionId"]
    with owner_engine.connect() as conn:
        transition = conn.execute(
            text("SELECT transition_id FROM execution WHERE id = :id"),
            {"id": fired["executionId"]},
        ).scalar_one()
    assert transition == "run"
    assert missing.returncode == 1
    assert missing.stderr.startswith("orquestador: refused (404 NOT_FOUND)")
