"""The deployment files work as shipped: gunicorn, systemd units, image, compose, dashboards.

No Docker engine runs here: the files are parsed and held to what an operator relies on;
`systemd-analyze verify` checks the units where it exists, `docker compose config` the
compose file where the plugin exists.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml
from gunicorn.config import Config
from gunicorn.workers.gthread import ThreadWorker

import orquestador.metrics as metrics
from orquestador.config import Settings
from orquestador.serve import RedactingGunicornLogger, gunicorn_options
from orquestador.worker.daemon import STOP_GRACE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy"
UNITS = {
    "orquestador-worker.service": "WORKER_ENABLED=true",
    "orquestador-api.service": "REQUEST_API_ENABLED=true",
}


def _metric_names() -> set[str]:
    return {
        value._name
        for value in vars(metrics).values()
        if hasattr(value, "_name") and hasattr(value, "_documentation")
    }


# --- gunicorn ------------------------------------------------------------------


def _gunicorn_config(monkeypatch: pytest.MonkeyPatch, **env: str) -> Config:
    """gunicorn.conf.py loaded the way gunicorn loads it: each name through its validator."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    config = Config()
    for name, value in namespace.items():
        if name in config.settings:
            config.set(name, value)
    return config


def test_gunicorn_conf_runs_gthread_workers_with_a_graceful_timeout_above_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _gunicorn_config(
        monkeypatch, API_PORT="8181", API_WORKERS="3", WORKER_DRAIN_SECONDS="25"
    )
    assert issubclass(config.worker_class, ThreadWorker)
    assert config.threads >= 2
    assert config.workers == 3
    assert config.address == [("127.0.0.1", 8181)]
    assert config.graceful_timeout > 25
    assert config.wsgi_app == "orquestador.api.app:create_app()"
    # Access lines through the redacting logger, in LOG_FORMAT, with the hooks of the
    # Prometheus multiprocess directory.
    assert issubclass(config.logger_class, RedactingGunicornLogger)
    assert config.accesslog == "-"
    for hook in ("on_starting", "when_ready", "post_fork", "child_exit", "on_exit"):
        assert getattr(config, hook).__module__ == "orquestador.serve"


@pytest.mark.parametrize(
    ("trusted", "allowed"),
    [("", []), ("10.0.0.5/24, ::1", ["10.0.0.0/24", "::1/128"]), ("192.0.2.7", ["192.0.2.7/32"])],
)
def test_gunicorn_believes_forwarded_headers_from_trusted_proxies_only(
    monkeypatch: pytest.MonkeyPatch, trusted: str, allowed: list[str]
) -> None:
    # gunicorn's own default is loopback; empty TRUSTED_PROXIES means nobody, loopback too.
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    config = _gunicorn_config(monkeypatch, TRUSTED_PROXIES=trusted)
    assert config.forwarded_allow_ips == allowed


def test_orquestador_api_and_gunicorn_conf_apply_the_same_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    expected = gunicorn_options(Settings.from_env())
    assert {name: namespace[name] for name in expected} == expected


# --- systemd -------------------------------------------------------------------


def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (DEPLOY / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("name", sorted(UNITS))
def test_units_are_hardened_and_cannot_be_switched_off_by_their_environment_file(
    name: str,
) -> None:
    service = _unit(name)["Service"]
    single = {key: values[-1] for key, values in service.items()}
    assert single["User"] == "orquestador" and single["Group"] == "orquestador"
    assert single["NoNewPrivileges"] == "true"
    assert single["ProtectSystem"] == "strict"
    assert single["ProtectHome"] == "true"
    assert single["PrivateTmp"] == "true"
    assert single["CapabilityBoundingSet"] == ""
    assert single["RestartPreventExitStatus"] == "2"
    assert single["Restart"] == "on-failure"
    assert single["EnvironmentFile"] == "/etc/orquestador/env"
    # The switch is on the command line: a line in the environment file cannot undo it.
    command = single["ExecStart"].split()
    assert command[0] == "/usr/bin/env"
    assert UNITS[name] in command[1:-2]
    assert command[-2:][0].endswith("/orquestador")
    # Environment= may repeat the switch (the file overrides it; the command line wins).
    assert service.get("Environment", [UNITS[name]]) == [UNITS[name]]
    # The stop timeout leaves room for the worker's whole stop budget (the drain, then its
    # threads' grace) or the API's graceful timeout.
    defaults = Settings.from_env({})
    graceful = gunicorn_options(defaults)["graceful_timeout"]
    worker_budget = defaults.worker_drain_seconds + STOP_GRACE_SECONDS
    assert int(single["TimeoutStopSec"]) > (graceful if "api" in name else worker_budget)


def test_the_api_unit_keeps_its_metrics_files_in_its_runtime_directory() -> None:
    service = _unit("orquestador-api.service")["Service"]
    (directory,) = service["RuntimeDirectory"]
    assert f"PROMETHEUS_MULTIPROC_DIR=/run/{directory}/metrics" in service["ExecStart"][0]


def test_the_sysusers_file_creates_the_units_account() -> None:
    lines = [
        line.split()
        for line in (DEPLOY / "orquestador.sysusers.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [line[:2] for line in lines] == [["u", "orquestador"]]
    assert lines[0][-1] == "/usr/sbin/nologin"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    # Copied: verify reads the files by path and reports problems against that path.
    copies = [shutil.copy(DEPLOY / name, tmp_path / name) for name in sorted(UNITS)]
    result = subprocess.run(
        ["systemd-analyze", "verify", *map(str, copies)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    about_ours = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if any(name in line for name in UNITS)
    ]
    assert result.returncode == 0 and about_ours == [], result.stdout + result.stderr


# --- image and compose -------------------------------------------------------------


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_the_image_builds_in_one_stage_and_runs_unprivileged_in_another() -> None:
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    instructions = [line.split()[0].upper() for line in final]
    assert any(line.startswith("COPY --from=") for line in final)
    assert not any("pip install" in line for line in final)
    (user,) = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert user.split(":")[0] not in ("0", "root")
    (healthcheck,) = [line for line in final if line.upper().startswith("HEALTHCHECK ")]
    assert '"orquestador", "health"' in healthcheck
    assert "ENTRYPOINT" in instructions
    assert instructions.index("USER") < instructions.index("ENTRYPOINT")


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_runs_postgres_18_migrations_as_owner_and_the_runtime_role_idempotently() -> None:
    services = _compose()["services"]
    assert services["db"]["image"].startswith("postgres:18")
    role = services["runtime-role"]
    assert "/deploy/create-runtime-role.sql" in role["command"]
    assert role["restart"] == "no"
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate", "upgrade"]
    assert "orquestador_owner" in migrate["environment"]["MIGRATION_DATABASE_URL"]
    assert migrate["depends_on"]["runtime-role"]["condition"] == "service_completed_successfully"
    for name in ("api", "worker"):
        service = services[name]
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "orquestador_runtime" in service["environment"]["DATABASE_URL"]
        assert service["healthcheck"]["test"] == ["CMD", "orquestador", "health"]
    assert services["api"]["environment"]["REQUEST_API_ENABLED"] == "true"
    assert services["worker"]["environment"]["WORKER_ENABLED"] == "true"


def test_compose_gives_the_worker_an_smtp_sink_with_a_web_ui_and_its_metrics_port() -> None:
    services = _compose()["services"]
    sink = services["mailpit"]
    assert sink["image"].startswith("axllent/mailpit")
    assert "127.0.0.1:8025:8025" in sink["ports"]
    worker = services["worker"]
    assert worker["environment"]["SMTP_URL"] == "smtp://mailpit:1025"
    port = worker["environment"]["WORKER_METRICS_PORT"]
    assert f"127.0.0.1:{port}:{port}" in worker["ports"]
    # Stop timeouts above the worker's stop budget and gunicorn's graceful timeout (API).
    budget = Settings.from_env({}).worker_drain_seconds + STOP_GRACE_SECONDS
    assert int(worker["stop_grace_period"].rstrip("s")) > budget
    graceful = gunicorn_options(Settings.from_env({}))["graceful_timeout"]
    assert int(services["api"]["stop_grace_period"].rstrip("s")) > graceful


def test_compose_publishes_only_the_proxy_and_metrics_on_loopback() -> None:
    compose = _compose()
    services = compose["services"]
    proxy, api = services["proxy"], services["api"]
    # nginx with the shipped configuration, in front of gunicorn, is the one public port.
    assert proxy["image"].startswith("nginx:")
    assert (
        "./docs/deploy/nginx.conf.template:/etc/nginx/templates/default.conf.template:ro"
        in proxy["volumes"]
    )
    assert proxy["environment"]["ORQUESTADOR_API"] == f"api:{api['expose'][0]}"
    assert proxy["ports"] == [f"{proxy['environment']['ORQUESTADOR_LISTEN']}:8080"]
    # The API believes forwarded headers from the proxy's fixed address and nobody else,
    # inside the stack's subnet.
    address = proxy["networks"]["default"]["ipv4_address"]
    assert api["environment"]["TRUSTED_PROXIES"] == address
    (subnet,) = compose["networks"]["default"]["ipam"]["config"]
    assert ip_address(address) in ip_network(subnet["subnet"])
    # The API's /metrics is on its own address, published on loopback like every other
    # port but the proxy's; PostgreSQL is not published at all.
    bind = api["environment"]["METRICS_BIND"]
    assert api["ports"] == [f"127.0.0.1:{bind.rsplit(':', 1)[1]}:{bind.rsplit(':', 1)[1]}"]
    for name, service in services.items():
        if name != "proxy":
            assert all(port.startswith("127.0.0.1:") for port in service.get("ports", [])), name


def _docker_compose_exists() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _docker_compose_exists(), reason="no docker compose plugin here")
def test_docker_compose_config_accepts_the_file() -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={"JWT_SECRET": "compose-config-check", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# --- dashboards and alerts ------------------------------------------------------------


def _exprs(panels: list[dict[str, Any]]) -> list[str]:
    found = []
    for panel in panels:
        found += [target["expr"] for target in panel.get("targets", [])]
        found += _exprs(panel.get("panels", []))
    return found


def test_the_grafana_dashboard_charts_every_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    text = "\n".join(_exprs(dashboard["panels"]))
    for name in _metric_names():
        assert re.search(rf"\b{name}", text), name
    used = set(re.findall(r"orquestador_[a-z_]+", text))
    suffixes = ("_bucket", "_count", "_sum", "_total")
    known = {f"{name}{suffix}" for name in _metric_names() for suffix in ("", *suffixes)}
    assert used <= known, used - known


def test_the_alert_rules_read_existing_metrics_and_link_a_runbook_entry() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yaml").read_text())["groups"][0]["rules"]
    operations = (ROOT / "docs" / "OPERATIONS.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#{2,4} (.+)$", operations, re.MULTILINE)
    }
    known = {f"{name}{suffix}" for name in _metric_names() for suffix in ("", "_total")}
    for rule in rules:
        used = set(re.findall(r"orquestador_[a-z_]+", rule["expr"]))
        assert used and used <= known, rule["alert"]
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: no heading for #{anchor}"
