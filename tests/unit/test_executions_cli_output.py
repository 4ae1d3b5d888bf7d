"""What `orquestador executions show` prints of a view, without a server."""

from __future__ import annotations

import pytest

from orquestador.cli.executions import _print_then_and_now, print_execution

VIEW = {
    "id": "5d0c0000-0000-4000-8000-000000000001",
    "requestId": "7a1e0000-0000-4000-8000-000000000002",
    "flowId": "9f3b0000-0000-4000-8000-000000000003",
    "flowKey": "reboot",
    "flowVersion": 1,
    "transitionId": "reboot",
    "status": "PENDING",
    "attempts": 0,
    "priority": 9,
    "steps": [],
}


def test_show_prints_the_priority_and_whose_turn_a_pending_execution_waits_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocked = {"key": "m-9", "limit": 1, "holders": 1, "heldBy": ["8e21…"]}
    print_execution({**VIEW, "blockedBy": blocked})
    lines = capsys.readouterr().out.splitlines()
    assert "priority    9" in lines
    assert "waits for   its turn under key m-9 (at most 1 at a time; 1 held by 8e21…)" in lines


def test_show_says_the_holders_are_unreadable_rather_than_listing_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocked = {"key": "m-9", "limit": 2, "holders": 2, "heldBy": []}
    print_execution({**VIEW, "blockedBy": blocked})
    out = capsys.readouterr().out
    assert "2 held by executions you may not read" in out


def test_show_prints_no_turn_line_for_an_execution_that_waits_for_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_execution(VIEW)
    assert "waits for" not in capsys.readouterr().out


def test_show_prints_a_waiting_command_s_output_without_its_control_characters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    waiting = {
        "commandId": "c0d30000-0000-4000-8000-000000000004",
        "machineId": "m-7",
        "command": "reboot",
        "status": "running",
        "output": "rebooting in 5\n\x1b]0;owned\x07done",
        "outputTruncated": True,
    }
    step = {"actionId": "wait", "status": "WAITING", "waitingFor": waiting}

    _print_then_and_now({**VIEW, "status": "WAITING", "steps": [step]})

    out = capsys.readouterr().out
    assert "output, last 200 lines (part of a long output was dropped):" in out
    assert "    rebooting in 5" in out.splitlines()
    assert "    ?]0;owned?done" in out.splitlines()
    assert "\x1b" not in out
