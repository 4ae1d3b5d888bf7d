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
