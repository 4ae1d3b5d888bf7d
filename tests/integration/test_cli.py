"""The command line on a real server: migrate, check, token, and the refusals operators see."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from sqlalchemy import create_engine, pool, text

from orquestador.config import sqlalchemy_url
from orquestador.db import migrate
from orquestador.db.schema import WRITE_BATCH_SIGNATURE
from tests.db_support import (
    RUNTIME_ROLE,
    TestServer,
    create_database,
    drop_database,
    ensure_runtime_role,
)

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]


def _run(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def empty_database_name(pg_server: TestServer) -> Iterator[str]:
    ensure_runtime_role(pg_server)
    name = create_database(pg_server, "orquestador_cli")
    try:
        yield name
    finally:
        drop_database(pg_server, name)


@pytest.fixture
def empty_database_url(pg_server: TestServer, empty_database_name: str) -> str:
    return pg_server.url(empty_database_name).render_as_string(hide_password=False)


@pytest.fixture
def runtime_url(pg_server: TestServer, empty_database_name: str) -> str:
    """The same database as the restricted runtime role connects to it."""
    return pg_server.url(empty_database_name, runtime=True).render_as_string(hide_password=False)


def test_migrate_upgrade_current_and_downgrade(empty_database_url: str) -> None:
    env = {
        "MIGRATION_DATABASE_URL": empty_database_url,
        "RUNTIME_DATABASE_ROLE": "orquestador_test_runtime",
    }
    assert _run(["migrate", "current"], env).stdout.strip() == "base"
    upgraded = _run(["migrate", "upgrade"], env)
    assert upgraded.returncode == 0, upgraded.stderr
    head = migrate.head_revision()
    assert f"database at revision {head}" in upgraded.stdout
    assert _run(["migrate", "current"], env).stdout.strip() == head

    refused = _run(["migrate", "downgrade"], env)
    assert refused.returncode == 2
    assert "downgrade needs a target revision" in refused.stderr

    downgraded = _run(["migrate", "downgrade", "0002"], env)
    assert downgraded.returncode == 0, downgraded.stderr
    assert _run(["migrate", "current"], env).stdout.strip() == "0002"


def test_migrate_against_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    result = _run(
        ["migrate", "upgrade"],
        {"MIGRATION_DATABASE_URL": "postgresql://x@127.0.0.1:1/db", "RUNTIME_DATABASE_ROLE": "r"},
    )
    assert result.returncode == 1
    assert result.stderr.startswith("orquestador: migration failed:")
    assert "Traceback" not in result.stderr


def test_migrate_refuses_a_runtime_url_without_an_owner_url() -> None:
    result = _run(["migrate", "upgrade"], {"DATABASE_URL": "postgresql://app@127.0.0.1/db"})
    assert result.returncode == 2
    assert "MIGRATION_DATABASE_URL is not set" in result.stderr


def test_check_reports_an_unreachable_database() -> None:
    result = _run(["check"], {"DATABASE_URL": "postgresql://x@127.0.0.1:1/db"})
    assert result.returncode == 1
    assert result.stderr.startswith("orquestador: DATABASE_URL: cannot connect")


def test_check_refuses_an_unusable_smtp_url_without_echoing_its_password() -> None:
    result = _run(["check"], {"SMTP_URL": "smtp://mailer:s3cret-pw@mail.example.com:587/inbox"})
    assert result.returncode == 2
    assert result.stderr.startswith("orquestador: SMTP_URL: ")
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_check_passes_on_a_migrated_database_with_the_runtime_role(
    empty_database_url: str, runtime_url: str
) -> None:
    migrated = _run(
        ["migrate"],
        {"MIGRATION_DATABASE_URL": empty_database_url, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE},
    )
    assert migrated.returncode == 0, migrated.stderr
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 0, result.stderr
    assert "configuration is valid" in result.stdout
    assert "holds every privilege" in result.stdout


def test_worker_refuses_to_start_when_not_enabled() -> None:
    result = _run(["worker"], {"DATABASE_URL": "postgresql://app@127.0.0.1/db"})
    assert result.returncode == 2
    assert "WORKER_ENABLED is not true" in result.stderr


def test_token_without_a_key_says_where_it_looked_and_how_to_point_it_at_one(
    tmp_path: Path,
) -> None:
    result = _run(["token", "--sub", "ana", "--org", "acme"], {}, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no signing key" in lines[0]
    assert str(tmp_path.resolve() / ".orquestador" / "dev-jwt-secret") in lines[0]
    assert "ORQUESTADOR_HOME" in lines[0] and "JWT_SECRET" in lines[0]


def test_token_finds_the_development_key_through_orquestador_home(tmp_path: Path) -> None:
    home = tmp_path / "project" / ".orquestador"
    home.mkdir(parents=True)
    secret = "dev-key-" + "y" * 32
    (home / "dev-jwt-secret").write_text(secret + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run(
        ["token", "--sub", "alice", "--org", "acme", "--lifetime", "60"],
        {"ORQUESTADOR_HOME": str(home)},
        cwd=elsewhere,
    )
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(
        result.stdout.strip(), secret, algorithms=["HS256"], audience="orquestador-api"
    )
    assert claims["exp"] - claims["iat"] == 60


def test_token_is_signed_with_the_configured_secret(tmp_path: Path) -> None:
    secret = "cli-test-secret-" + "x" * 32
    result = _run(
        ["token", "--sub", "ana", "--org", "acme", "--scope", "requests:read requests:write"],
        {"JWT_SECRET": secret},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(
        result.stdout.strip(), secret, algorithms=["HS256"], audience="orquestador-api"
    )
    assert (claims["sub"], claims["org"], claims["iss"]) == ("ana", "acme", "orquestador")
    assert claims["scope"] == "requests:read requests:write"


def test_dev_on_an_unreachable_database_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    result = _run(["dev"], {"DATABASE_URL": "postgresql://x@127.0.0.1:1/db"}, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("orquestador: migration failed:")
    assert "Traceback" not in result.stderr


def test_migrate_refuses_when_it_cannot_tell_which_role_to_grant(
    empty_database_url: str,
) -> None:
    result = _run(["migrate", "upgrade"], {"MIGRATION_DATABASE_URL": empty_database_url})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "RUNTIME_DATABASE_ROLE" in lines[0] and "--no-runtime-grants" in lines[0]
    env = {"MIGRATION_DATABASE_URL": empty_database_url}
    assert _run(["migrate", "current"], env).stdout.strip() == "base"


def test_migrate_refuses_a_runtime_role_that_does_not_exist(empty_database_url: str) -> None:
    result = _run(
        ["migrate"],
        {"MIGRATION_DATABASE_URL": empty_database_url, "RUNTIME_DATABASE_ROLE": "nobody_here"},
    )
    assert result.returncode == 2
    assert "runtime role 'nobody_here' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_names_missing_grants_until_migrate_grant_repairs_them(
    empty_database_url: str, runtime_url: str
) -> None:
    owner = {"MIGRATION_DATABASE_URL": empty_database_url}
    skipped = _run(["migrate", "--no-runtime-grants"], owner)
    assert skipped.returncode == 0, skipped.stderr
    assert "orquestador migrate grant" in skipped.stdout

    refused = _run(["check"], {"DATABASE_URL": runtime_url})
    assert refused.returncode == 1
    problems = refused.stderr.strip().splitlines()
    assert (
        f"orquestador: DATABASE_URL: role '{RUNTIME_ROLE}' lacks SELECT, INSERT, UPDATE"
        " on table execution" in problems
    )
    assert any("lacks SELECT, INSERT on table audit_event" in line for line in problems)
    assert problems[-1].endswith(f"RUNTIME_DATABASE_ROLE={RUNTIME_ROLE} orquestador migrate grant")
    assert "Traceback" not in refused.stderr

    granted = _run(["migrate", "grant"], {**owner, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE})
    assert granted.returncode == 0, granted.stderr
    assert _run(["check"], {"DATABASE_URL": runtime_url}).returncode == 0
    # Idempotent: granting again changes nothing and succeeds.
    again = _run(["migrate", "grant"], {**owner, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE})
    assert again.returncode == 0, again.stderr


def test_a_second_migrate_grants_what_the_first_could_not(
    empty_database_url: str, runtime_url: str
) -> None:
    owner = {"MIGRATION_DATABASE_URL": empty_database_url}
    assert _run(["migrate", "--no-runtime-grants"], owner).returncode == 0
    assert _run(["check"], {"DATABASE_URL": runtime_url}).returncode == 1
    second = _run(["migrate"], {**owner, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE})
    assert second.returncode == 0, second.stderr
    assert f"runtime role '{RUNTIME_ROLE}': grants in place" in second.stdout
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 0, result.stderr


def test_check_on_an_unmigrated_database_says_to_migrate(runtime_url: str) -> None:
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "sees no table" in lines[0] and "orquestador migrate" in lines[0]


def test_check_on_a_database_behind_this_release_says_to_upgrade(
    empty_database_url: str, runtime_url: str
) -> None:
    env = {"MIGRATION_DATABASE_URL": empty_database_url, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE}
    # Granted, but one revision short: the tables of 0013 are not there yet.
    assert _run(["migrate", "upgrade", "0012"], env).returncode == 0
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    missing = (
        "approval, bulk_action, bulk_item, function_bound, key_release, machine_agent,"
        " machine_credential,"
        " page_session_revocation, rate_bucket, rollout, rollout_child, schedule, schedule_fire,"
        " sign_in_link"
    )
    assert f"sees no table {missing}" in line
    assert "run 'orquestador migrate'" in line
    # Every table, but a column the code writes gone: named, never a database error.
    assert _run(["migrate", "upgrade"], env).returncode == 0
    with create_engine(sqlalchemy_url(empty_database_url), poolclass=pool.NullPool).begin() as c:
        c.execute(text("ALTER TABLE machine_command DROP COLUMN cancel_requested_at"))
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "lacks column machine_command.cancel_requested_at" in line
    assert "run 'orquestador migrate'" in line
    with create_engine(sqlalchemy_url(empty_database_url), poolclass=pool.NullPool).begin() as c:
        c.execute(text("ALTER TABLE machine_command ADD COLUMN cancel_requested_at timestamptz"))
    assert _run(["migrate", "grant"], env).returncode == 0
    assert _run(["migrate", "upgrade"], env).returncode == 0
    assert _run(["check"], {"DATABASE_URL": runtime_url}).returncode == 0
    # Every table there, but not the worker's batch function (as at 0009, before 0013).
    owner = create_engine(sqlalchemy_url(empty_database_url), poolclass=pool.NullPool)
    with owner.begin() as connection:
        connection.execute(text(f"DROP FUNCTION {WRITE_BATCH_SIGNATURE}"))
    owner.dispose()
    result = _run(["check"], {"DATABASE_URL": runtime_url})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "function orquestador_write_batch is missing" in line
    assert "orquestador migrate upgrade" in line


def test_grant_refuses_a_database_behind_the_code(empty_database_url: str) -> None:
    env = {"MIGRATION_DATABASE_URL": empty_database_url, "RUNTIME_DATABASE_ROLE": RUNTIME_ROLE}
    assert _run(["migrate", "upgrade", "0002"], env).returncode == 0
    result = _run(["migrate", "grant"], env)
    assert result.returncode == 1
    assert "database at revision 0002" in result.stderr
    assert "orquestador migrate upgrade" in result.stderr


@pytest.mark.parametrize(
    ("command", "settings"),
    [
        ("worker", ["DATABASE_URL", "WORKER_ENABLED", "WORKER_CONCURRENCY", "RETRY_CAP_SECONDS"]),
        ("api", ["DATABASE_URL", "REQUEST_API_ENABLED", "JWT_SECRET", "API_PORT"]),
        ("migrate", ["MIGRATION_DATABASE_URL", "RUNTIME_DATABASE_ROLE", "ORQUESTADOR_HOME"]),
        ("token", ["JWT_SECRET", "JWT_PRIVATE_KEY_FILE", "ORQUESTADOR_HOME"]),
        ("dev", ["DATABASE_URL", "ORQUESTADOR_HOME", "WORKER_ENABLED", "API_PORT"]),
        ("check", ["DATABASE_URL", "MIGRATION_DATABASE_URL", "LOG_LEVEL"]),
        ("health", ["API_PORT", "WORKER_ENABLED", "DATABASE_URL"]),
    ],
)
def test_each_command_help_lists_the_settings_it_reads(command: str, settings: list[str]) -> None:
    result = _run([command, "--help"], {})
    assert result.returncode == 0, result.stderr
    epilog = result.stdout.split("settings read", 1)[1]
    for name in settings:
        assert name in epilog, name


def test_token_help_shows_the_lifetime_option() -> None:
    result = _run(["token", "--help"], {})
    assert "--ttl SECONDS, --lifetime SECONDS" in result.stdout
    assert "lifetime of the token in seconds (default: 3600)" in " ".join(result.stdout.split())


def test_health_probes_the_worker_database(runtime_url: str) -> None:
    result = _run(["health"], {"WORKER_ENABLED": "true", "DATABASE_URL": runtime_url})
    assert result.returncode == 0, result.stderr
    assert "healthy: worker database" in result.stdout
    down = _run(
        ["health"], {"WORKER_ENABLED": "true", "DATABASE_URL": "postgresql://x@127.0.0.1:1/db"}
    )
    assert down.returncode == 1
    assert down.stderr.startswith("orquestador: worker: DATABASE_URL: cannot connect")


def test_health_probes_the_api_only_where_an_api_switch_is_on() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        # Bound, never listening: nothing answers on this port.
        result = _run(["health"], {"REQUEST_API_ENABLED": "true", "API_PORT": str(port)})
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"orquestador: API: no answer from http://127.0.0.1:{port}/api/v1/healthz"
    )
    idle = _run(["health"], {"API_PORT": str(port)})
    assert idle.returncode == 0
    assert "nothing to probe" in idle.stdout
