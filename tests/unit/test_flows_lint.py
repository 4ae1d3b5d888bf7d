"""`orquestador flows lint FLOW.json`: real files, real exit codes, one line per finding."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from orquestador.domain.reachability import unreachable

CLEAN: dict[str, Any] = {
    "key": "reboot",
    "trigger": "manual",
    "initialState": "new",
    "states": ["new", "rebooting", "failed"],
    "transitions": [
        {
            "id": "reboot",
            "from": ["new"],
            "actions": [
                {
                    "id": "send",
                    "capability": "machine.command",
                    "version": 1,
                    "input": {},
                    "onError": "failed",
                }
            ],
            "to": "rebooting",
        }
    ],
}


def _lint(tmp_path: Path, content: str) -> subprocess.CompletedProcess[str]:
    flow = tmp_path / "flow.json"
    flow.write_text(content, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "flows", "lint", str(flow)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_clean_flow_exits_0_and_says_so_in_one_line(tmp_path: Path) -> None:
    result = _lint(tmp_path, json.dumps(CLEAN))

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{tmp_path / 'flow.json'}: ok: no findings"]


def test_unreached_states_and_transitions_that_can_never_run_are_one_line_each(
    tmp_path: Path,
) -> None:
    flow = copy.deepcopy(CLEAN)
    flow["states"] += ["archived", "gone"]
    flow["transitions"].append({"id": "purge", "from": ["archived"], "to": "gone"})

    result = _lint(tmp_path, json.dumps(flow))

    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == [
        f"{tmp_path / 'flow.json'}: /states/3: no transition reaches state 'archived' from 'new'",
        f"{tmp_path / 'flow.json'}: /states/4: no transition reaches state 'gone' from 'new'",
        f"{tmp_path / 'flow.json'}: /transitions/1/from: transition 'purge' can never run: no"
        " path reaches any state it leaves from",
    ]


def test_a_shadowed_rule_and_an_exit_to_an_undeclared_state_are_found(tmp_path: Path) -> None:
    flow = copy.deepcopy(CLEAN)
    transition = flow["transitions"][0]
    transition["actions"][0]["onError"] = "nowhere"
    del transition["to"]
    transition["decision"] = {
        "hitPolicy": "FIRST",
        "inputs": ["/actions/send/status"],
        "rules": [
            {"id": "any", "when": ["-"], "then": {"to": "rebooting"}},
            {"id": "ok", "when": ['"succeeded"'], "then": {"to": "rebooting"}},
        ],
    }

    result = _lint(tmp_path, json.dumps(flow))

    assert result.returncode == 1
    assert "/transitions/0/actions/0/onError: unknown state 'nowhere'" in result.stdout
    assert "/transitions/0/decision/rules/1" in result.stdout


def test_a_file_that_is_not_json_or_cannot_be_read(tmp_path: Path) -> None:
    broken = _lint(tmp_path, "{not json")
    missing = subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "flows", "lint", str(tmp_path / "no.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert broken.returncode == 1 and "not JSON" in broken.stdout
    assert missing.returncode == 2 and "cannot be read" in missing.stderr
    assert "Traceback" not in broken.stderr + missing.stderr


def test_error_exits_and_decision_rules_reach_their_states() -> None:
    flow = copy.deepcopy(CLEAN)
    flow["states"].append("checked")
    flow["transitions"].append(
        {
            "id": "check",
            "from": ["failed"],
            "decision": {
                "hitPolicy": "FIRST",
                "inputs": [],
                "rules": [{"id": "r", "when": [], "then": {"to": "checked"}}],
            },
        }
    )

    assert unreachable(flow) == []


def test_a_write_after_an_approval_and_a_loop_that_never_waits_are_one_line_each(
    tmp_path: Path,
) -> None:
    flow = copy.deepcopy(CLEAN)
    flow["transitions"][0]["actions"].insert(
        0, {"id": "ok", "capability": "approval", "version": 1, "input": {}}
    )
    flow["states"].append("again")
    flow["transitions"] += [
        {"id": "loop", "from": ["rebooting"], "to": "again"},
        {"id": "back", "from": ["again"], "to": "rebooting"},
    ]
    flow["continue"] = {"rebooting": "loop", "again": "back"}

    result = _lint(tmp_path, json.dumps(flow))

    assert result.returncode == 1
    lines = result.stdout.splitlines()
    path = str(tmp_path / "flow.json")
    assert lines[0].startswith(f"{path}: /continue/again: continuing from 'again' can come back")
    assert lines[1].startswith(f"{path}: /continue/rebooting: continuing from 'rebooting'")
    assert lines[2].startswith(f"{path}: /transitions/0/actions/1: 'send' may write")
    assert len(lines) == 3
