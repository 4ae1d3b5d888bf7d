"""Settings come from the environment, with defaults, and refuse nonsense with clear lines."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orquestador.config import Settings
from orquestador.errors import ConfigError


def test_defaults_match_the_specification() -> None:
    settings = Settings.from_env({})
    assert (settings.worker_concurrency, settings.worker_batch, settings.worker_poll_ms) == (
        10,
        10,
        500,
    )
    assert (settings.worker_lease_seconds, settings.worker_renew_seconds) == (60, 15)
    assert settings.worker_drain_seconds == 20
    assert not (
        settings.worker_enabled or settings.request_api_enabled or settings.flow_admin_enabled
    )
    assert settings.api_max_body_bytes == 1024 * 1024


def test_every_setting_is_listed_in_env_example() -> None:
    from dataclasses import fields
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / ".env.example"
    listed = {
        line.split("=", 1)[0].lstrip("# ").strip()
        for line in example.read_text().splitlines()
        if "=" in line
    }
    names = {f.metadata["env"] for f in fields(Settings)}
    assert names <= listed, f"missing from .env.example: {sorted(names - listed)}"
    defaults = {f.metadata["env"]: f.default for f in fields(Settings)}
    for line in example.read_text().splitlines():
        name, _, value = line.lstrip("# ").partition("=")
        if name.strip() in defaults:
            assert value.strip() == defaults[name.strip()], name


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"WORKER_CONCURRENCY": "ten"}, "WORKER_CONCURRENCY='ten': expected a whole number"),
        ({"WORKER_BATCH": "0"}, "WORKER_BATCH must be greater than zero"),
        ({"WORKER_ENABLED": "perhaps"}, "WORKER_ENABLED='perhaps': expected true or false"),
        (
            {"WORKER_LEASE_SECONDS": "60", "WORKER_RENEW_SECONDS": "30"},
            "WORKER_RENEW_SECONDS=30 must be below half of WORKER_LEASE_SECONDS=60",
        ),
        ({"DATABASE_URL": "mysql://db/app"}, "DATABASE_URL: not a PostgreSQL URL"),
        ({"DATABASE_URL": "::nonsense::"}, "DATABASE_URL: not a database URL"),
        ({"JWT_ALGORITHMS": "none"}, "JWT_ALGORITHMS must list algorithms"),
    ],
)
def test_invalid_values_are_refused_with_one_line_each(
    environ: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ)
    assert any(fragment in problem for problem in raised.value.problems)


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(
            {"WORKER_BATCH": "x", "WORKER_POLL_MS": "-1", "DATABASE_URL": "mysql://a"}
        )
    assert len(raised.value.problems) == 3


def test_check_command_explains_a_renew_interval_too_close_to_the_lease() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "check"],
        env={"WORKER_LEASE_SECONDS": "60", "WORKER_RENEW_SECONDS": "40", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "WORKER_RENEW_SECONDS=40 must be below half of WORKER_LEASE_SECONDS=60" in result.stderr
    assert "Traceback" not in result.stderr


def test_org_weights_are_organization_weight_pairs_and_a_bad_item_is_named() -> None:
    settings = Settings.from_env({"ORG_WEIGHTS": " acme=3, globex=0.5 "})
    assert settings.org_weight_map == {"acme": 3.0, "globex": 0.5}
    assert Settings.from_env({}).org_weight_map == {}
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"ORG_WEIGHTS": "acme=3,globex,initech=0"})
    assert [line for line in str(refused.value).split("; ") if "ORG_WEIGHTS" in line] == [
        "ORG_WEIGHTS: 'globex' is not organization=weight with a weight above 0"
        " (e.g. acme=3,globex=0.5)",
        "ORG_WEIGHTS: 'initech=0' is not organization=weight with a weight above 0"
        " (e.g. acme=3,globex=0.5)",
    ]


@pytest.mark.parametrize(
    ("raw", "address"),
    [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)), ("", None)],
)
def test_metrics_bind_is_a_host_and_port(raw: str, address: tuple[str, int] | None) -> None:
    assert Settings.from_env({"METRICS_BIND": raw}).metrics_address == address


@pytest.mark.parametrize("raw", ["9464", "::1:9464", "localhost:0", "host:65536", ":9464"])
def test_a_bad_metrics_bind_is_one_line(raw: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"METRICS_BIND": raw})
    (line,) = refused.value.problems
    assert line.startswith("METRICS_BIND must be HOST:PORT")
