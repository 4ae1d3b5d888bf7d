"""A running execution's cancel is said in two audit rows: the request and the holder's."""

from __future__ import annotations

from types import SimpleNamespace

from orquestador.api.views import read_facts


def _row(kind: str, cancelled: list[str], stop: list[str]) -> SimpleNamespace:
    def commands(ids: list[str]) -> list[dict[str, str]]:
        return [{"id": i, "machineId": "m-1", "command": "reboot"} for i in ids]

    detail = {
        "machineCommands": {"cancelled": commands(cancelled), "stopRequested": commands(stop)}
    }
    return SimpleNamespace(kind=kind, detail=detail)


def test_the_view_keeps_what_both_rows_of_a_running_cancel_did_to_the_commands() -> None:
    audit = [
        _row("CANCEL_REQUESTED", ["c-1"], ["c-2"]),
        # The holder's transaction withdrew one more its step wrote; c-2 is still asked.
        _row("EXECUTION_CANCELLED", ["c-3"], ["c-2"]),
    ]

    _, _, _, commands, _ = read_facts(audit)

    assert commands is not None
    assert [c["id"] for c in commands["cancelled"]] == ["c-1", "c-3"]
    assert [c["id"] for c in commands["stopRequested"]] == ["c-2"]
