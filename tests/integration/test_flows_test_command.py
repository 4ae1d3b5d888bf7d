"""`orquestador flows test FLOW.json --cases CASES.json`: real files, a real engine, exit codes.

Each run is the command itself in a process of its own, as an author or a CI job runs it:
on a new database of the test server (DATABASE_URL), dropped afterwards, or, with no
DATABASE_URL, on an embedded server in a temporary folder.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from sqlalchemy import create_engine, pool, text

from orquestador.config import libpq_url
from tests.db_support import TestServer
from tests.integration.api_support import DECOMMISSION


def _power_off() -> dict[str, Any]:
    """The API tests' decommission flow, waiting an hour for its command."""
    flow = copy.deepcopy(DECOMMISSION)
    flow["transitions"][0]["actions"][1]["input"]["deadlineSeconds"] = {"const": 3600}
    return flow


POWER_OFF = _power_off()
FAILED_COMMAND = {"commandId": "0b6c4f4e-4a7d-4a43-9d59-3f1c2f0e8a11", "status": "failed"}
PASSING_CASES = [
    {
        "name": "the machine powers off",
        "data": {"machineId": "m-1"},
        "transition": "power-off",
        "expect": {"state": "off", "outcome": "DONE", "status": "SUCCEEDED"},
    },
    {
        "name": "the command fails on the machine",
        "data": {"machineId": "m-1"},
        "transition": "power-off",
        "outcomes": {"wait": {"output": {**FAILED_COMMAND, "exitCode": 1}}},
        "expect": {"state": "attention", "outcome": "REVIEW"},
    },
    {
        "name": "the agent never answers",
        "data": {"machineId": "m-1"},
        "transition": "power-off",
        "outcomes": {"wait": {"deadline": True}},
        "expect": {"state": "attention", "status": "FAILED", "errorCode": "WAIT_DEADLINE_EXCEEDED"},
    },
]


def _flows_test(
    tmp_path: Path,
    cases: Any,
    *,
    flow: Any = POWER_OFF,
    database_url: str | None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    flow_file, cases_file = tmp_path / "power-off.json", tmp_path / "cases.json"
    flow_file.write_text(flow if isinstance(flow, str) else json.dumps(flow), encoding="utf-8")
    cases_file.write_text(
        cases if isinstance(cases, str) else json.dumps({"cases": cases}), encoding="utf-8"
    )
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DATABASE_URL", "MIGRATION_DATABASE_URL")
    }
    environment["ORQUESTADOR_HOME"] = str(tmp_path / "home")
    if database_url is not None:
        environment["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "orquestador.cli", "flows", "test", str(flow_file)]
    return subprocess.run(
        [*command, "--cases", str(cases_file), *extra],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def _throwaway_databases(server: TestServer) -> set[str]:
    engine = create_engine(server.admin_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            found = connection.execute(
                text(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'orquestador_flows_test_%'"
                )
            )
            return set(found.scalars())
    finally:
        engine.dispose()


def test_cases_that_hold_pass_on_an_embedded_engine_with_a_junit_report(tmp_path: Path) -> None:
    """No DATABASE_URL: an embedded server of its own; a passed deadline costs no waiting."""
    began = time.monotonic()
    run = _flows_test(
        tmp_path, PASSING_CASES, database_url=None, extra=("--junit", str(tmp_path / "r.xml"))
    )
    took = time.monotonic() - began

    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines == [f"PASS  {case['name']}" for case in PASSING_CASES] + [
        "3 cases: 3 passed, 0 failed"
    ]
    # The engine's own API logs no line per request: the cases' lines are the output.
    assert "HTTP/1.1" not in run.stderr
    # The deadline of an hour was rehearsed, not waited for.
    assert took < 60
    report = ElementTree.parse(tmp_path / "r.xml").getroot()
    assert report.tag == "testsuite"
    assert (report.get("tests"), report.get("failures")) == ("3", "0")
    assert [case.get("name") for case in report] == [case["name"] for case in PASSING_CASES]


def test_a_case_that_does_not_hold_fails_by_name_and_the_database_is_dropped(
    tmp_path: Path, pg_server: TestServer
) -> None:
    wrong = {
        "name": "a failed command still powers off",
        "data": {"machineId": "m-1"},
        "transition": "power-off",
        "outcomes": {"wait": {"output": {**FAILED_COMMAND, "exitCode": 1}}},
        "expect": {"state": "off"},
    }
    refused = {
        "name": "a transition the flow lacks",
        "data": {"machineId": "m-1"},
        "transition": "power-on",
        "expect": {"status": "SUCCEEDED"},
    }
    before = _throwaway_databases(pg_server)

    run = _flows_test(
        tmp_path,
        [PASSING_CASES[0], wrong, refused],
        database_url=libpq_url(pg_server.admin_url),
        extra=("--junit", str(tmp_path / "r.xml")),
    )

    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "PASS  the machine powers off"
    assert lines[1] == (
        "FAIL  a failed command still powers off: expected state off, got attention "
        "(it ended status SUCCEEDED, state attention, outcome REVIEW)"
    )
    assert lines[2].startswith(
        "FAIL  a transition the flow lacks: the dry run was refused: TRANSITION_UNKNOWN"
    )
    assert lines[3] == "3 cases: 1 passed, 2 failed"
    assert "HTTP/1.1" not in run.stderr
    report = ElementTree.parse(tmp_path / "r.xml").getroot()
    failures = {case.get("name"): case.find("failure") for case in report}
    assert failures["the machine powers off"] is None
    assert failures[wrong["name"]].get("message") == "expected state off, got attention"
    # Nothing of this run's is left; a test running beside it may drop its own meanwhile.
    assert _throwaway_databases(pg_server) <= before


def test_a_flow_that_cannot_be_published_fails_with_its_problems(
    tmp_path: Path, pg_server: TestServer
) -> None:
    broken = {**POWER_OFF, "initialState": "nowhere"}

    run = _flows_test(
        tmp_path, PASSING_CASES, flow=broken, database_url=libpq_url(pg_server.admin_url)
    )

    assert run.returncode == 1
    assert "power-off.json: cannot be published:" in run.stdout
    assert "/initialState: unknown state 'nowhere'" in run.stdout
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("cases", "said"),
    [
        ("{not json", "cases.json: not JSON"),
        (json.dumps({"cases": []}), "cases.json: /cases: [] should be non-empty"),
        (
            json.dumps({"cases": [{**PASSING_CASES[0], "expect": {"colour": "red"}}]}),
            "cases.json: /cases/0/expect: Additional properties are not allowed",
        ),
        (
            json.dumps({"cases": [PASSING_CASES[0], PASSING_CASES[0]]}),
            "cases.json: /cases/1/name: the name 'the machine powers off' is given twice",
        ),
    ],
    ids=["not-json", "no-cases", "unknown-expectation", "twice"],
)
def test_a_cases_file_not_of_the_format_is_a_usage_error(
    tmp_path: Path, cases: str, said: str
) -> None:
    """Refused before any engine starts: exit 2, the problem at its path, no traceback."""
    run = _flows_test(tmp_path, cases, database_url="postgresql://nobody@127.0.0.1:9/none")

    assert run.returncode == 2
    assert said in run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout == ""


def test_a_flow_file_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    run = _flows_test(
        tmp_path, PASSING_CASES, flow=b"\xff\xfe".decode("latin-1"), database_url=None
    )

    assert run.returncode == 2
    assert "power-off.json: not JSON" in run.stderr
