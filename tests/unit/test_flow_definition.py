"""Flow definitions: what publishing rejects, typed access, destinations and updates."""

import copy
import json
import re
from pathlib import Path

import pytest

from orquestador.domain import limits
from orquestador.domain.decision import check_table, evaluate
from orquestador.domain.errors import DecisionError, MappingError
from orquestador.domain.flow_definition import (
    FlowDefinition,
    compute_updates,
    decide_destination,
    definition_schema,
    validate_definition,
)
from orquestador.domain.mappings import build_context

ROOT = Path(__file__).resolve().parents[2]

DECOMMISSION = {
    "key": "decommission",
    "trigger": "manual",
    "dataSchema": {"type": "object", "properties": {"machineId": {"type": "string"}}},
    "initialState": "new",
    "states": ["new", "off", "attention"],
    "transitions": [
        {
            "id": "power-off",
            "from": ["new"],
            "actions": [
                {
                    "id": "send",
                    "capability": "machine.command",
                    "version": 1,
                    "input": {
                        "machineId": {"from": "/data/machineId"},
                        "command": {"const": "poweroff"},
                    },
                    "onError": "attention",
                },
                {
                    "id": "wait",
                    "capability": "machine.wait",
                    "version": 1,
                    "input": {
                        "commandId": {"from": "/actions/send/commandId"},
                        "deadlineSeconds": {"const": 30},
                    },
                    "onError": "attention",
                },
            ],
            "decision": {
                "hitPolicy": "FIRST",
                "inputs": ["/actions/wait/status"],
                "rules": [
                    {"id": "ok", "when": ['"succeeded"'], "then": {"to": "off", "outcome": "DONE"}},
                    {
                        "id": "other",
                        "when": ["-"],
                        "then": {"to": "attention", "outcome": "REVIEW"},
                    },
                ],
            },
            "updates": [{"path": "/power", "from": "/actions/wait/status"}],
        }
    ],
}


@pytest.fixture
def flow():
    return copy.deepcopy(DECOMMISSION)


def error_paths(definition, **kwargs):
    errors, _ = validate_definition(definition, **kwargs)
    return sorted(p.path for p in errors)


def test_the_spec_example_is_valid(flow):
    assert validate_definition(flow) == ([], [])


def test_the_documented_schema_is_the_packaged_one():
    documented = json.loads((ROOT / "docs" / "flow-definition.schema.json").read_text("utf-8"))
    assert documented == definition_schema()


def _flow_guide_blocks(info: str) -> list[str]:
    """The ```json blocks of FLOWS.md whose info string holds `info`."""
    text = (ROOT / "docs" / "FLOWS.md").read_text("utf-8")
    blocks = re.findall(r"```json([^\n]*)\n(.*?)```", text, flags=re.S)
    return [body for words, body in blocks if info in words.split()]


def test_the_documented_machine_example_is_the_spec_example():
    (example,) = _flow_guide_blocks("file=decommission.json")
    assert json.loads(example) == DECOMMISSION


def test_schema_errors_are_all_listed_with_their_json_paths(flow):
    del flow["trigger"]
    flow["key"] = "Not A Key"
    flow["transitions"][0]["actions"][1]["version"] = 0
    flow["transitions"][0]["actions"][0]["input"]["command"] = {"const": 1, "from": "/data"}
    flow["transitions"][0]["to"] = "off"  # both to and decision
    flow["transitions"][0]["updates"][0] = {"path": "/x"}
    assert error_paths(flow) == [
        "",
        "/key",
        "/transitions/0",
        "/transitions/0/actions/0/input/command",
        "/transitions/0/actions/1/version",
        "/transitions/0/updates/0",
    ]


def test_combinator_errors_say_what_to_do_instead_of_printing_the_object(flow):
    flow["transitions"][0]["to"] = "off"
    (problem,), _ = validate_definition(flow)
    assert problem.message == 'a transition has exactly one of "to" (a fixed state) or "decision"'


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("trigger",), "cron"),
        (("states",), []),
        (("states",), ["a", "a"]),
        (("transitions", 0, "from"), []),
        (("transitions", 0, "actions", 0, "surprise"), 1),
        (("transitions", 0, "actions", 0, "email"), "yes"),
        (("transitions", 0, "decision", "hitPolicy"), "MOST"),
        (("transitions", 0, "decision", "rules", 0, "then"), {"outcome": "DONE"}),
    ],
)
def test_shapes_the_schema_rejects(flow, where, value):
    target = flow
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = value
    assert error_paths(flow) != []


def test_unknown_states_are_reported_where_they_are_named(flow):
    flow["initialState"] = "fresh"
    transition = flow["transitions"][0]
    transition["from"] = ["new", "gone"]
    transition["actions"][0]["onError"] = "panic"
    transition["decision"]["rules"][1]["then"]["to"] = "limbo"
    assert error_paths(flow) == [
        "/initialState",
        "/transitions/0/actions/0/onError",
        "/transitions/0/decision/rules/1/then/to",
        "/transitions/0/from/1",
    ]


def test_fixed_destination_must_be_a_state(flow):
    del flow["transitions"][0]["decision"]
    flow["transitions"][0]["to"] = "nowhere"
    assert error_paths(flow) == ["/transitions/0/to"]


def test_duplicate_transition_and_action_ids(flow):
    transition = flow["transitions"][0]
    transition["actions"][1]["id"] = "send"
    transition["updates"] = []
    flow["transitions"].append({**copy.deepcopy(transition), "from": ["attention"]})
    assert "/transitions/1/id" in error_paths(flow)
    assert "/transitions/0/actions/1/id" in error_paths(flow)


def test_invalid_data_schema_is_reported_under_dataSchema(flow):
    flow["dataSchema"] = {"type": "object", "properties": {"x": {"type": "text"}}}
    assert error_paths(flow) == ["/dataSchema/properties/x/type"]


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"properties": {"x": {"$ref": "#/$defs/y"}}}, "/dataSchema/properties/x/$ref"),
        ({"properties": {"x": {"$ref": "https://example.org/s"}}}, "/dataSchema/properties/x/$ref"),
        ({"items": {"pattern": "a(?=b)"}}, "/dataSchema/items/pattern"),
        ({"anyOf": [{"$ref": "#"}]}, "/dataSchema/anyOf/0/$ref"),
    ],
)
def test_data_schemas_the_server_cannot_evaluate_safely_are_refused_at_the_keyword(
    flow, schema, path
):
    flow["dataSchema"] = schema
    assert error_paths(flow) == [path]


def test_a_recursive_data_schema_that_descends_is_accepted(flow):
    flow["dataSchema"] = {
        "type": "object",
        "$defs": {"node": {"properties": {"children": {"items": {"$ref": "#/$defs/node"}}}}},
        "properties": {"tree": {"$ref": "#/$defs/node"}},
    }
    assert validate_definition(flow) == ([], [])


def test_numbers_anywhere_are_bounded(flow):
    flow["transitions"][0]["actions"][0]["input"]["command"] = {"const": {"n": [1, 10**101]}}
    flow["dataSchema"]["maxProperties"] = 1e100
    assert error_paths(flow) == [
        "/dataSchema/maxProperties",
        "/transitions/0/actions/0/input/command/const/n/1",
    ]


@pytest.mark.parametrize(
    ("pointer", "ok"),
    [
        ("/data", True),
        ("/data/machineId", True),
        ("/request/id", True),
        ("/request/state", True),
        ("/request/owner", False),
        ("/actions/send/commandId", True),
        ("/actions/wait/status", False),  # the same action: it has not run yet
        ("/actions/later/x", False),
        ("/actions", False),
        ("/decision/outputs", False),
        ("/secrets/token", False),
        ("data/machineId", False),
        ("/data/~2", False),
    ],
)
def test_action_inputs_read_data_request_and_earlier_actions_only(flow, pointer, ok):
    flow["transitions"][0]["actions"][1]["input"]["commandId"] = {"from": pointer}
    expected = [] if ok else ["/transitions/0/actions/1/input/commandId/from"]
    assert error_paths(flow) == expected


def test_input_field_names_are_escaped_in_problem_paths(flow):
    flow["transitions"][0]["actions"][0]["input"]["a/b"] = {"from": "/nope"}
    assert error_paths(flow) == ["/transitions/0/actions/0/input/a~1b/from"]


@pytest.mark.parametrize(
    ("update", "bad"),
    [
        ({"path": "/power", "from": "/actions/wait/status"}, None),
        ({"path": "/power", "from": "/decision/outputs/outcome"}, None),
        ({"path": "/power", "from": "/decision/matches"}, None),
        ({"path": "/power", "const": None}, None),
        ({"path": "", "const": 1}, "path"),
        ({"path": "power", "const": 1}, "path"),
        ({"path": "/list/-", "const": 1}, "path"),
        ({"path": "/power", "from": "/actions/other/x"}, "from"),
        ({"path": "/power", "from": "/request/revision"}, "from"),
    ],
)
def test_update_paths_and_sources(flow, update, bad):
    flow["transitions"][0]["updates"] = [update]
    assert error_paths(flow) == ([f"/transitions/0/updates/0/{bad}"] if bad else [])


def test_updates_read_decision_only_when_the_transition_has_one(flow):
    transition = flow["transitions"][0]
    del transition["decision"]
    transition["to"] = "off"
    transition["updates"] = [{"path": "/x", "from": "/decision/outputs"}]
    assert error_paths(flow) == ["/transitions/0/updates/0/from"]


def test_decision_inputs_follow_the_update_read_rules(flow):
    flow["transitions"][0]["decision"]["inputs"] = ["/actions/wait/status", "/decision/x"]
    for rule in flow["transitions"][0]["decision"]["rules"]:
        rule["when"].append("-")
    assert error_paths(flow) == ["/transitions/0/decision/inputs/1"]


def test_decision_table_problems_are_located_under_the_transition(flow):
    decision = flow["transitions"][0]["decision"]
    decision["rules"][0]["when"] = ["< "]
    decision["rules"].append({"id": "late", "when": ['"x"'], "then": {"to": "off"}})
    errors, warnings = validate_definition(flow)
    assert [p.path for p in errors] == ["/transitions/0/decision/rules/0/when/0"]
    decision["rules"][0]["when"] = ['"succeeded"']
    errors, warnings = validate_definition(flow)
    assert errors == []
    assert [p.path for p in warnings] == ["/transitions/0/decision/rules/2"]


def test_capability_problems_are_errors_at_the_action_when_the_registry_is_consulted(flow):
    def problem(capability, version):
        return None if (capability, version) == ("machine.command", 1) else f"no {capability}"

    errors, _ = validate_definition(flow, capability_problem=problem)
    assert [p.as_dict() for p in errors] == [
        {"path": "/transitions/0/actions/1/capability", "message": "no machine.wait"}
    ]


def test_email_outside_notify_is_a_warning(flow):
    flow["transitions"][0]["actions"][0]["email"] = True
    errors, warnings = validate_definition(flow)
    assert errors == []
    assert [p.path for p in warnings] == ["/transitions/0/actions/0/email"]


def test_a_non_object_definition_is_one_schema_error():
    assert error_paths(["not", "a", "flow"]) == [""]


def test_a_transition_may_omit_actions(flow):
    transition = flow["transitions"][0]
    del transition["actions"], transition["decision"], transition["updates"]
    transition["to"] = "off"
    assert validate_definition(flow) == ([], [])
    assert FlowDefinition.from_json(flow).transitions["power-off"].actions == []


def test_a_flow_may_omit_its_data_schema_and_then_accepts_any_object(flow):
    del flow["dataSchema"]
    assert validate_definition(flow) == ([], [])
    assert FlowDefinition.from_json(flow).data_schema == {"type": "object"}


def test_a_missing_field_does_not_hide_an_unknown_initial_state(flow):
    del flow["trigger"]
    flow["initialState"] = "fresh"
    errors, _ = validate_definition(flow)
    assert [p.as_dict() for p in errors] == [
        {"path": "", "message": "'trigger' is a required property"},
        {"path": "/initialState", "message": "unknown state 'fresh'"},
    ]


def test_schema_and_semantic_problems_are_reported_together_each_at_its_path(flow):
    transition = flow["transitions"][0]
    transition["actions"][0]["version"] = 0  # schema
    transition["actions"][0]["onError"] = "panic"  # semantic, same action
    transition["actions"][1]["onError"] = "limbo"  # semantic, next action
    transition["from"] = ["new", 7, "gone"]  # schema at /from/1, semantic at /from/2
    transition["decision"]["rules"][0]["then"] = {}  # schema: the table is not checked
    flow["transitions"].append({"id": "back", "from": ["off"], "to": "nowhere"})
    flow["dataSchema"] = {"type": "object", "properties": {"x": {"type": "text"}}}
    assert error_paths(flow) == [
        "/dataSchema/properties/x/type",
        "/transitions/0/actions/0/onError",
        "/transitions/0/actions/0/version",
        "/transitions/0/actions/1/onError",
        "/transitions/0/decision/rules/0/then",
        "/transitions/0/from/1",
        "/transitions/0/from/2",
        "/transitions/1/to",
    ]


def test_a_malformed_action_with_a_good_id_stays_readable_by_later_actions(flow):
    # Reading /actions/send/... is right; only the version of "send" is wrong.
    flow["transitions"][0]["actions"][0]["version"] = "one"
    assert error_paths(flow) == ["/transitions/0/actions/0/version"]


def test_states_that_are_not_a_list_leave_state_names_unjudged(flow):
    flow["states"] = "new"
    flow["initialState"] = "fresh"
    assert error_paths(flow) == ["/states"]


# --- typed access and running ---------------------------------------------------------


def test_typed_accessors(flow):
    definition = FlowDefinition.from_json(flow)
    assert definition.initial_state == "new"
    assert definition.states == ("new", "off", "attention")
    transition = definition.transitions["power-off"]
    assert transition.leaves("new") and not transition.leaves("off")
    send, wait = transition.actions
    assert (send.capability, send.version, send.on_error, send.email) == (
        "machine.command",
        1,
        "attention",
        False,
    )
    assert wait.input["commandId"] == {"from": "/actions/send/commandId"}
    assert transition.to is None and transition.decision is not None


def context(status):
    return build_context(
        {"machineId": "m-1"},
        {"send": {"commandId": "c-1"}, "wait": {"status": status}},
        "r-1",
        "new",
    )


def test_decide_destination_with_a_table(flow):
    transition = FlowDefinition.from_json(flow).transitions["power-off"]
    decided = decide_destination(transition, context("succeeded"))
    assert (decided.to, decided.outcome, decided.hit_policy, decided.rule_ids) == (
        "off",
        "DONE",
        "FIRST",
        ["ok"],
    )
    assert decide_destination(transition, context("sent")).to == "attention"


def test_fixed_destination_has_no_outcome_or_rules(flow):
    raw = flow["transitions"][0]
    del raw["decision"]
    raw["to"] = "off"
    decided = decide_destination(FlowDefinition.from_json(flow).transitions["power-off"], {})
    assert (decided.to, decided.outcome, decided.rule_ids) == ("off", None, [])
    assert decided.result is None


def test_a_chosen_rule_without_to_is_an_invalid_table(flow):
    raw = flow["transitions"][0]["decision"]["rules"][0]
    raw["then"] = {"outcome": "DONE"}
    transition = FlowDefinition.from_json(flow).transitions["power-off"]
    with pytest.raises(DecisionError) as caught:
        decide_destination(transition, context("succeeded"))
    assert caught.value.code == "INVALID_TABLE"


def test_compute_updates_reads_actions_and_the_decision(flow):
    updates = flow["transitions"][0]["updates"]
    updates.append({"path": "/result", "from": "/decision/outputs/outcome"})
    updates.append({"path": "/checked", "const": True})
    transition = FlowDefinition.from_json(flow).transitions["power-off"]
    ctx = context("succeeded")
    decided = decide_destination(transition, ctx)
    assert compute_updates(transition, ctx, decided) == [
        ("/power", "succeeded"),
        ("/result", "DONE"),
        ("/checked", True),
    ]


def test_multi_hit_matches_are_readable_by_updates(flow):
    decision = flow["transitions"][0]["decision"]
    decision["hitPolicy"] = "RULE ORDER"
    flow["transitions"][0]["updates"] = [{"path": "/seen", "from": "/decision/ruleIds"}]
    transition = FlowDefinition.from_json(flow).transitions["power-off"]
    ctx = context("succeeded")
    decided = decide_destination(transition, ctx)
    assert decided.to == "off"
    assert compute_updates(transition, ctx, decided) == [("/seen", ["ok", "other"])]


def test_an_unresolvable_update_source_names_the_update(flow):
    transition = FlowDefinition.from_json(flow).transitions["power-off"]
    ctx = build_context({}, {"send": {}, "wait": {}}, "r-1", "new")
    with pytest.raises(MappingError) as caught:
        compute_updates(transition, ctx)
    assert "/power" in caught.value.message
    assert "/actions/wait/status" in caught.value.message


def test_every_table_in_the_flow_guide_is_a_valid_table():
    tables = [json.loads(block) for block in _flow_guide_blocks("decision")]
    assert len(tables) >= 5
    for table in tables:
        errors, warnings = check_table(table)
        assert (errors, warnings) == ([], [])
        evaluate(table, {"data": {"plan": "pro", "disk": 200, "backup": True}})


def test_a_definition_at_the_limits_publishes(flow):
    decision = flow["transitions"][0]["decision"]
    decision["rules"] = [
        {"id": f"r{n}", "when": [f'"{n}"'], "then": {"to": "off"}}
        for n in range(limits.MAX_RULES - 1)
    ] + [decision["rules"][-1]]
    last = limits.MAX_SCHEMA_CHAIN - 1
    flow["dataSchema"] = {
        "type": "object",
        "properties": {"machineId": {"type": "string", "maximum": 9.99e99}},
        "$ref": "#/$defs/d0",
        "$defs": {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(last)}
        | {f"d{last}": {"type": "object"}},
    }
    assert validate_definition(flow) == ([], [])
