"""`orquestador notices preferences` as an operator runs it: a real process against a real API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from orquestador.api.tokens import mint_token
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "notices-cli-test-secret-" + "0123456789abcdef" * 3
ORG = "acme"


@pytest.fixture
def env(database: TestDatabase) -> Iterator[dict[str, str]]:
    """The API on a loopback port, and the command's settings for an org:admin caller."""
    with served_api(database, SECRET) as (url, settings):
        token = mint_token(settings, sub="ops", org=ORG, scopes=["org:admin"])
        yield {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}


def _preferences(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "notices", "preferences", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_set_changes_only_what_it_is_given_and_show_reads_it_back(env: dict[str, str]) -> None:
    before = _preferences("show", "--org", ORG, env=env)
    recipients = _preferences(
        "set", "--org", ORG, "--recipient", "ops@example.com", "--recipient", "b@example.com",
        env=env,
    )  # fmt: skip
    opted_out = _preferences("set", "--org", ORG, "--opt-out", "automation", env=env)
    shown = _preferences("show", "--org", ORG, "--json", env=env)
    opted_in = _preferences("set", "--org", ORG, "--opt-in", "automation", env=env)

    assert before.returncode == 0, before.stderr
    assert "recipients    nobody: notices stay on the panel" in before.stdout
    assert "updated       never: the defaults" in before.stdout
    assert recipients.returncode == 0, recipients.stderr
    assert "recipients    ops@example.com, b@example.com" in recipients.stdout
    # The recipients stay as they were when only the opt-outs change.
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["recipients"] == ["ops@example.com", "b@example.com"]
    assert json.loads(shown.stdout)["optOut"] == ["automation"]
    assert "opted out     automation" in opted_out.stdout
    assert "opted out     nothing: every category is e-mailed" in opted_in.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("set", "--org", ORG), "set needs something to change"),
        (("show", "--org", ORG, "--no-recipients"), "show takes only --org"),
        (
            ("set", "--org", ORG, "--recipient", "a@example.com", "--no-recipients"),
            "say opposite things",
        ),
        (
            ("set", "--org", ORG, "--opt-out", "automation", "--opt-in", "automation"),
            "both name automation",
        ),
    ],
)
def test_usage_problems_are_one_line_and_exit_2(
    env: dict[str, str], args: tuple[str, ...], said: str
) -> None:
    result = _preferences(*args, env=env)

    assert result.returncode == 2
    assert said in result.stderr and "Traceback" not in result.stderr


def test_an_address_the_server_refuses_is_its_problem_and_changes_nothing(
    env: dict[str, str],
) -> None:
    refused = _preferences("set", "--org", ORG, "--recipient", "Ops <ops@example.com>", env=env)
    after = _preferences("show", "--org", ORG, "--json", env=env)

    assert refused.returncode == 1
    assert "refused (422 PREFERENCES_INVALID)" in refused.stderr
    assert "/recipients/0" in refused.stderr
    assert json.loads(after.stdout)["recipients"] == []


def test_another_organization_is_as_missing_as_one_that_does_not_exist(
    env: dict[str, str],
) -> None:
    result = _preferences("show", "--org", "globex", env=env)

    assert result.returncode == 1
    assert "refused (404 NOT_FOUND)" in result.stderr
