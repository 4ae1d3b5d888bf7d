"""`orquestador decide`: flow authors try a table without running a flow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TABLE = {
    "hitPolicy": "FIRST",
    "inputs": ["/data/size"],
    "rules": [
        {"id": "small", "when": ["< 10"], "then": {"to": "small", "outcome": "S"}},
        {"id": "medium", "when": ["[10..20]"], "then": {"to": "medium", "outcome": "M"}},
    ],
}


def _decide(tmp_path: Path, table: object, context: object) -> subprocess.CompletedProcess[str]:
    for name, content in (("t.json", table), ("c.json", context)):
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orquestador.cli",
            "decide",
            "--table",
            "t.json",
            "--context",
            "c.json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prints_the_policy_rules_and_outputs(tmp_path: Path) -> None:
    result = _decide(tmp_path, TABLE, {"data": {"size": 12}})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "hitPolicy": "FIRST",
        "ruleIds": ["medium"],
        "outputs": {"to": "medium", "outcome": "M"},
    }


def test_no_match_exits_1_with_the_code(tmp_path: Path) -> None:
    result = _decide(tmp_path, TABLE, {"data": {"size": 99}})
    assert result.returncode == 1
    assert result.stderr.startswith("NO_RULE_MATCHED:")
    assert result.stdout == ""


def test_hit_policy_violation_exits_1(tmp_path: Path) -> None:
    table = {
        **TABLE,
        "hitPolicy": "UNIQUE",
        "rules": [
            *TABLE["rules"],
            {"id": "any", "when": ["-"], "then": {"to": "other", "outcome": "O"}},
        ],
    }
    result = _decide(tmp_path, table, {"data": {"size": 3}})
    assert result.returncode == 1
    assert result.stderr.startswith("HIT_POLICY_VIOLATION:")


def test_unreadable_input_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    result = _decide(tmp_path, "{not json", {})
    assert result.returncode == 2
    assert "--table: t.json is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
