"""The agent's systemd unit (docs/deploy/orquestador-agent.service) is hardened as the
others are, runs the agent from its own environment file, and passes systemd-analyze."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "docs" / "deploy" / "orquestador-agent.service"
INSTALLED = "/opt/orquestador/venv/bin/orquestador"


def _service() -> dict[str, str]:
    values: dict[str, str] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service":
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def test_the_agent_unit_is_hardened_and_unprivileged() -> None:
    service = _service()

    assert service["DynamicUser"] == "yes"
    assert service["User"] not in ("root", "0", "orquestador")  # not the API's account
    for key in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "RestrictSUIDSGID",
    ):
        assert service[key] == "true", key
    assert service["ProtectSystem"] == "strict"
    assert service["CapabilityBoundingSet"] == ""
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert service["UMask"] == "0077"


def test_the_agent_unit_runs_the_agent_with_its_token_from_a_root_only_file() -> None:
    service = _service()

    assert service["ExecStart"] == f"{INSTALLED} agent"
    assert service["EnvironmentFile"] == "/etc/orquestador/agent.env"
    assert service["Restart"] == "on-failure"
    # A configuration error (exit 2) is not restarted; a refused token (exit 1) is, slowly.
    assert service["RestartPreventExitStatus"] == "2"
    assert int(service["RestartSec"]) >= 10
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    assert "ORQUESTADOR_TOKEN=" in UNIT.read_text()  # the file's contents are documented


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_finds_nothing_to_say_about_the_agent_unit(tmp_path: Path) -> None:
    # The installed path does not exist here: point it at this environment's console
    # script, so verify checks everything else as it would on a machine.
    console_script = Path(sys.executable).parent / "orquestador"
    assert console_script.exists()
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(INSTALLED, str(console_script)))

    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )

    about_ours = [
        line for line in (result.stdout + result.stderr).splitlines() if UNIT.name in line
    ]
    assert result.returncode == 0 and about_ours == [], result.stdout + result.stderr
