"""Publishing refuses what could only fail at run time: constants, commands, reads of outputs.

The app loads the configured adapters (built-ins), as `orquestador api` does, so the
checks run against the real contracts and the real MACHINE_COMMANDS setting.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import DECOMMISSION, Api, problem, running_api


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, registry=None) as api:
        yield api


def _flow(change: Any) -> dict[str, Any]:
    definition = copy.deepcopy(DECOMMISSION)
    change(definition["transitions"][0])
    return definition


def _refused(api: Api, definition: dict[str, Any]) -> dict[str, str]:
    response = api.post("/flows", definition)
    assert response.status_code == 422, response.get_data(as_text=True)
    body = problem(response)
    assert body["code"] == "FLOW_INVALID"
    return {p["path"]: p["message"] for p in body["problems"]}


def test_the_shipped_example_still_publishes(api: Api) -> None:
    assert api.post("/flows", DECOMMISSION).status_code == 201


def test_a_constant_outside_the_adapters_input_schema_is_refused_with_its_pointer(
    api: Api,
) -> None:
    def long_wait(t: dict[str, Any]) -> None:
        t["actions"][1]["input"]["deadlineSeconds"] = {"const": 999999}

    problems = _refused(api, _flow(long_wait))

    assert set(problems) == {"/transitions/0/actions/1/input/deadlineSeconds"}
    assert "86400" in problems["/transitions/0/actions/1/input/deadlineSeconds"]


def test_a_constant_command_outside_machine_commands_is_refused(database) -> None:
    def wipe(t: dict[str, Any]) -> None:
        t["actions"][0]["input"]["command"] = {"const": "wipe"}

    with running_api(database.runtime_dsn, registry=None, machine_commands="poweroff") as api:
        problems = _refused(api, _flow(wipe))
        # The same allow-list, read from the same setting: reboot is off here.
        reboot = _flow(lambda t: t["actions"][0]["input"].update(command={"const": "reboot"}))
        assert set(_refused(api, reboot)) == {"/transitions/0/actions/0/input/command"}
        assert api.post("/flows", DECOMMISSION).status_code == 201

    message = problems["/transitions/0/actions/0/input/command"]
    assert "'wipe'" in message and "MACHINE_COMMANDS" in message


def test_a_command_from_request_data_stays_a_run_time_check(api: Api) -> None:
    def from_data(t: dict[str, Any]) -> None:
        t["actions"][0]["input"]["command"] = {"from": "/data/command"}

    assert api.post("/flows", _flow(from_data)).status_code == 201


def test_inputs_the_adapter_can_never_take_are_refused(api: Api) -> None:
    def broken(t: dict[str, Any]) -> None:
        del t["actions"][0]["input"]["machineId"]
        t["actions"][1]["input"]["timeout"] = {"const": 5}

    problems = _refused(api, _flow(broken))

    assert set(problems) == {
        "/transitions/0/actions/0/input",
        "/transitions/0/actions/1/input/timeout",
    }
    assert "machineId" in problems["/transitions/0/actions/0/input"]


def test_a_read_of_an_output_field_the_adapter_cannot_have_is_refused(api: Api) -> None:
    def tell_then_read(t: dict[str, Any]) -> None:
        t["actions"].append(
            {
                "id": "tell",
                "capability": "notify",
                "version": 1,
                "input": {"title": {"const": "Off"}, "body": {"const": "m-1 is off"}},
            }
        )
        t["updates"] = [
            {"path": "/notice", "from": "/actions/tell/noticeId"},
            {"path": "/nothing", "from": "/actions/tell/mailedTo"},
            {"path": "/bit", "from": "/actions/wait/status/0"},
        ]

    problems = _refused(api, _flow(tell_then_read))

    # noticeId is declared; notify's output is closed, so mailedTo never exists; the
    # status is a string, so nothing can be read inside it.
    assert set(problems) == {"/transitions/0/updates/1/from", "/transitions/0/updates/2/from"}
    assert "'tell'" in problems["/transitions/0/updates/1/from"]


def test_an_email_input_on_notify_is_refused_pointing_to_the_nodes_field(api: Api) -> None:
    def tell(t: dict[str, Any]) -> None:
        t["actions"].append(
            {
                "id": "tell",
                "capability": "notify",
                "version": 1,
                "input": {
                    "title": {"const": "Off"},
                    "body": {"const": "m-1 is off"},
                    "email": {"const": True},
                },
            }
        )

    problems = _refused(api, _flow(tell))

    assert set(problems) == {"/transitions/0/actions/2/input/email"}
    assert "/transitions/0/actions/2/email" in problems["/transitions/0/actions/2/input/email"]

    def ticked(t: dict[str, Any]) -> None:
        tell(t)
        del t["actions"][2]["input"]["email"]
        t["actions"][2]["email"] = True

    assert api.post("/flows", _flow(ticked)).status_code == 201
