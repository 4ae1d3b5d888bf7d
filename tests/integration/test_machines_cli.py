"""`orquestador machines enroll|list|revoke` as an operator runs them, against a real
database as its owner; the token printed is one the API takes until it is revoked."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from sqlalchemy import Engine, text

from tests.integration.api_support import SECRET, Api, bearer, running_api

ROOT = Path(__file__).resolve().parents[2]
ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
ORG = "acme"


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def machines(database, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ
    }
    environment.update(MIGRATION_DATABASE_URL=database.owner_dsn, JWT_SECRET=SECRET, USER="ana")
    environment.update(env)
    return subprocess.run(
        [*ORQUESTADOR, "machines", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def take(api: Api, token: str) -> int:
    return (
        api.client().post("/api/v1/agent/commands/next?wait=0", headers=bearer(token)).status_code
    )


def test_enroll_prints_a_long_lived_token_whose_id_is_stored(
    database, api: Api, owner_engine: Engine
) -> None:
    enrolled = machines(database, "enroll", "m-1", "--org", ORG)

    assert enrolled.returncode == 0, enrolled.stderr
    token = enrolled.stdout.strip()
    assert "\n" not in token
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience="orquestador-api")
    assert (claims["sub"], claims["org"], claims["scope"]) == ("machine:m-1", ORG, "agent")
    assert claims["exp"] - claims["iat"] == 365 * 86400  # MACHINE_TOKEN_DAYS
    with owner_engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT id, org_id, machine_id, issued_by, extract(epoch FROM expires_at)"
                " FROM machine_credential"
            )
        ).one()
    assert tuple(row) == (claims["jti"], ORG, "m-1", "cli:ana", claims["exp"])
    assert claims["jti"] in enrolled.stderr and "revoke it with" in enrolled.stderr
    assert take(api, token) == 204


def test_days_set_the_lifetime(database) -> None:
    by_option = machines(database, "enroll", "m-1", "--org", ORG, "--days", "30")
    by_setting = machines(database, "enroll", "m-2", "--org", ORG, MACHINE_TOKEN_DAYS="7")

    for enrolled, days in ((by_option, 30), (by_setting, 7)):
        assert enrolled.returncode == 0, enrolled.stderr
        claims = jwt.decode(
            enrolled.stdout.strip(), SECRET, algorithms=["HS256"], audience="orquestador-api"
        )
        assert claims["exp"] - claims["iat"] == days * 86400


def test_revoke_refuses_the_token_from_the_next_request_and_list_says_so(
    database, api: Api
) -> None:
    old = machines(database, "enroll", "m-1", "--org", ORG).stdout.strip()
    new = machines(database, "enroll", "m-1", "--org", ORG).stdout.strip()
    old_id = jwt.decode(old, options={"verify_signature": False})["jti"]

    one = machines(database, "revoke", "m-1", "--org", ORG, "--credential", old_id)
    listed = machines(database, "list", "--org", ORG)

    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == f"revoked credential {old_id} of machine m-1 of {ORG}"
    assert (take(api, old), take(api, new)) == (401, 204)
    rows = [line.split("\t") for line in listed.stdout.strip().splitlines()[1:]]
    states = {row[1]: row[4] for row in rows}
    assert states[old_id].startswith("revoked ") and states[old_id].endswith(" by cli:ana")
    assert list(states.values()).count("valid") == 1

    rest = machines(database, "revoke", "m-1", "--org", ORG)
    again = machines(database, "revoke", "m-1", "--org", ORG)

    assert rest.returncode == again.returncode == 0
    assert take(api, new) == 401
    assert again.stdout.startswith("nothing to revoke")


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["revoke", "m-9", "--org", ORG], 1, "machine m-9 of acme has no credential"),
        (["revoke", "m-1", "--org", "other"], 1, "machine m-1 of other has no credential"),
        (["enroll", "m 1", "--org", ORG], 2, "MACHINE_ID must not contain spaces"),
        (["enroll", "m-1", "--org", ORG, "--days", "0"], 2, "--days must be greater than zero"),
        (["enroll", "m-1", "--org", "x" * 201], 2, "--org is longer than 200 characters"),
    ],
)
def test_refusals_are_one_line_and_a_status(
    database, args: list[str], status: int, says: str
) -> None:
    assert machines(database, "enroll", "m-1", "--org", ORG).returncode == 0

    refused = machines(database, *args)

    assert refused.returncode == status
    assert refused.stderr.startswith(f"orquestador: {says}"), refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_runtime_role_alone_cannot_enroll(database, owner_engine: Engine) -> None:
    refused = machines(
        database,
        "enroll",
        "m-1",
        "--org",
        ORG,
        MIGRATION_DATABASE_URL="",
        DATABASE_URL=database.runtime_dsn,
    )

    assert refused.returncode == 2
    assert "MIGRATION_DATABASE_URL is not set" in refused.stderr
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM machine_credential")).scalar_one() == 0


def test_an_ad_hoc_machine_token_lasts_a_day_at_most() -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env["JWT_SECRET"] = SECRET
    token = [*ORQUESTADOR, "token", "--machine", "m-1", "--org", ORG, "--ttl"]

    day = subprocess.run([*token, "86400"], env=env, cwd=ROOT, capture_output=True, text=True)
    longer = subprocess.run([*token, "86401"], env=env, cwd=ROOT, capture_output=True, text=True)

    assert day.returncode == 0, day.stderr
    assert longer.returncode == 2 and longer.stdout == ""
    assert "orquestador machines enroll m-1 --org acme" in longer.stderr


def test_list_says_when_each_machine_s_agent_was_last_seen_or_that_it_is_offline(
    database, api: Api, owner_engine: Engine
) -> None:
    alive = machines(database, "enroll", "m-1", "--org", ORG).stdout.strip()
    machines(database, "enroll", "m-2", "--org", ORG)
    stopped = machines(database, "enroll", "m-3", "--org", ORG).stdout.strip()
    assert take(api, alive) == take(api, stopped) == 204  # each poll is a sign of life
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE machine_agent SET last_seen_at = now() - interval '5 minutes'"
                " WHERE machine_id = 'm-3'"
            )
        )

    listed = machines(database, "list", "--org", ORG)

    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.strip().splitlines()
    assert header.split("\t")[-1] == "AGENT"
    agents = {line.split("\t")[0]: line.split("\t")[-1] for line in lines}
    assert agents["m-1"].startswith("agent last seen ") and agents["m-1"].endswith(" s ago")
    assert agents["m-2"] == "no agent seen yet"
    assert agents["m-3"].startswith("offline: agent last seen 5 min")
