"""`orquestador quotas show` as an operator runs it: a real process against a real API."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orquestador.api.tokens import mint_token
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "quotas-cli-test-secret-" + "0123456789abcdef" * 3
ORG = "acme"


def _quotas(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "quotas", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_show_lists_each_quota_with_its_limit_and_use(database: TestDatabase) -> None:
    with served_api(database, SECRET) as (url, settings):
        token = mint_token(settings, sub="ops", org=ORG, scopes=["org:admin"])
        env = {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}
        shown = _quotas("show", "--org", ORG, env=env)
        as_json = _quotas("show", "--org", ORG, "--json", env=env)
        foreign = _quotas("show", "--org", "globex", env=env)

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["quota", "limit", "used"]
    assert ["schedules", "100", "0"] in [line.split() for line in lines]
    assert ["scheduleMinSeconds", "60", "-"] in [line.split() for line in lines]
    assert ["openExecutions", "100000", "0"] in [line.split() for line in lines]
    assert ["rolloutItems", "10000", "-"] in [line.split() for line in lines]
    assert json.loads(as_json.stdout)["quotas"]["transitionsBurst"]["limit"] == 200
    assert foreign.returncode == 1 and "404" in foreign.stderr
