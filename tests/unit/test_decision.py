"""Decision tables: S-FEEL unary tests and the DMN 1.3 hit policies."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orquestador.domain.decision import (
    HIT_POLICIES,
    DecisionResult,
    check_table,
    evaluate,
    parse_unary_tests,
    result_as_json,
)
from orquestador.domain.errors import DecisionError

# --- unary tests ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "matching", "not_matching"),
    [
        ("-", ["x", 1, None, True, [1], {}], []),
        ('"succeeded"', ["succeeded"], ["failed", 1, None]),
        ('"say \\"hi\\""', ['say "hi"'], ["say hi"]),
        ("5", [5, 5.0], [6, "5", True]),
        ("-2.5", [-2.5], [2.5]),
        ("true", [True], [False, 1, "true"]),
        ("false", [False], [0, None]),
        ("null", [None], [0, "", False]),
        ("= 3", [3], [4]),
        ("< 10", [9, -1, 9.99], [10, 11, "9", True, None]),
        ("<= 10", [10], [10.01]),
        ("> 10", [11], [10]),
        (">= 10", [10], [9]),
        ('< "m"', ["a", "lz"], ["m", "z", 1]),
        ("[1..5]", [1, 3, 5], [0, 6, "3"]),
        ("(1..5]", [2, 5], [1]),
        ("[1..5)", [1, 4.9], [5]),
        ("]1..5[", [2, 4], [1, 5]),
        ('["a".."c"]', ["a", "bz", "c"], ["cc", "A"]),
        ('"a", "b", 3', ["a", "b", 3], ["c", 4]),
        ("1, [5..7]", [1, 6], [2, 8]),
        ('not("a", "b")', ["c", 1, None], ["a", "b"]),
        ("not([1..5])", [0, 6, "x"], [3]),
        ("  <   10 ", [1], [10]),
    ],
)
def test_unary_test_semantics(text, matching, not_matching):
    test = parse_unary_tests(text)
    assert [v for v in matching if not test.matches(v)] == []
    assert [v for v in not_matching if test.matches(v)] == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "<",
        "abc",
        "1 2",
        '"open',
        "[1..5",
        "[1..5}",
        '[1.."a"]',
        "< true",
        "not 1",
        "not(1",
        "1,",
        '"\\q"',
        "- 1",
    ],
)
def test_malformed_unary_tests_are_invalid_tables(text):
    with pytest.raises(DecisionError) as caught:
        parse_unary_tests(text)
    assert caught.value.code == "INVALID_TABLE"


# --- hit policies ---------------------------------------------------------------


def rule(rule_id, when, **then):
    return {"id": rule_id, "when": when, "then": then}


# Modelled on DMN TCK 0004-simpletable-U: applicant age, risk category, affordability.
APPROVAL_INPUTS = ["/data/age", "/data/risk", "/data/affordable"]
APPROVAL_U = {
    "hitPolicy": "UNIQUE",
    "inputs": APPROVAL_INPUTS,
    "rules": [
        rule("approved", [">=18", '"Medium","Low"', "true"], status="Approved"),
        rule("minor", ["<18", '"Medium","Low"', "true"], status="Declined"),
        rule("high-risk", ["-", '"High"', "true"], status="Declined"),
        rule("unaffordable", ["-", "-", "false"], status="Declined"),
    ],
}


def applicant(age, risk, affordable):
    return {"data": {"age": age, "risk": risk, "affordable": affordable}}


@pytest.mark.parametrize(
    ("age", "risk", "affordable", "status", "rule_id"),
    [
        (18, "Medium", True, "Approved", "approved"),
        (17, "Low", True, "Declined", "minor"),
        (40, "High", True, "Declined", "high-risk"),
        (40, "Low", False, "Declined", "unaffordable"),
    ],
)
def test_unique_table_like_tck_0004(age, risk, affordable, status, rule_id):
    result = evaluate(APPROVAL_U, applicant(age, risk, affordable))
    assert result.outputs == {"status": status}
    assert result.rule_ids == [rule_id]
    assert result.matches == [{"status": status}]


def test_unique_with_two_matches_is_a_violation():
    table = {**APPROVAL_U, "rules": [*APPROVAL_U["rules"], rule("adult", [">=18", "-", "-"])]}
    with pytest.raises(DecisionError) as caught:
        evaluate(table, applicant(30, "Low", True))
    assert caught.value.code == "HIT_POLICY_VIOLATION"


# Modelled on TCK 0005-simpletable-A: overlapping rules that agree.
APPROVAL_A = {
    "hitPolicy": "ANY",
    "inputs": APPROVAL_INPUTS,
    "rules": [
        rule("approved", [">=18", '"Medium","Low"', "true"], status="Approved"),
        rule("minor", ["<18", "-", "-"], status="Declined"),
        rule("high-risk", ["-", '"High"', "-"], status="Declined"),
        rule("unaffordable", ["-", "-", "false"], status="Declined"),
    ],
}


def test_any_returns_the_agreed_output_and_every_agreeing_rule():
    result = evaluate(APPROVAL_A, applicant(17, "High", False))
    assert result.outputs == {"status": "Declined"}
    assert result.rule_ids == ["minor", "high-risk", "unaffordable"]
    assert result.matches == [{"status": "Declined"}]


def test_any_with_disagreeing_outputs_is_a_violation():
    table = {
        **APPROVAL_A,
        "rules": [*APPROVAL_A["rules"], rule("vip", ["-", "-", "-"], status="Approved")],
    }
    with pytest.raises(DecisionError) as caught:
        evaluate(table, applicant(17, "High", False))
    assert caught.value.code == "HIT_POLICY_VIOLATION"


def test_any_compares_outputs_by_json_type():
    table = {
        "hitPolicy": "ANY",
        "inputs": [],
        "rules": [rule("a", [], flag=True), rule("b", [], flag=1)],
    }
    with pytest.raises(DecisionError):
        evaluate(table, {})


# Modelled on TCK 0006-simpletable-P: priority decided by the output values list.
APPROVAL_P = {
    "hitPolicy": "PRIORITY",
    "inputs": APPROVAL_INPUTS,
    "outputValues": {"status": ["Declined", "Approved"]},
    "rules": [
        rule("approved", [">=18", "-", "-"], status="Approved"),
        rule("high-risk", ["-", '"High"', "-"], status="Declined"),
        rule("unaffordable", ["-", "-", "false"], status="Declined"),
    ],
}


def test_priority_picks_the_highest_ranked_output_not_the_first_rule():
    result = evaluate(APPROVAL_P, applicant(30, "High", False))
    assert result.outputs == {"status": "Declined"}
    assert result.rule_ids == ["high-risk"]  # ties keep rule order
    assert evaluate(APPROVAL_P, applicant(30, "Low", True)).rule_ids == ["approved"]


def test_priority_compares_outputs_in_the_order_outputValues_lists_them():
    table = {
        "hitPolicy": "PRIORITY",
        "inputs": [],
        "outputValues": {"outcome": ["URGENT", "NORMAL"], "to": ["a", "b"]},
        "rules": [
            rule("normal-a", [], to="a", outcome="NORMAL"),
            rule("urgent-b", [], to="b", outcome="URGENT"),
            rule("urgent-a", [], to="a", outcome="URGENT"),
        ],
    }
    assert evaluate(table, {}).rule_ids == ["urgent-a"]


def test_priority_ranks_unlisted_values_last():
    table = {
        "hitPolicy": "PRIORITY",
        "inputs": [],
        "outputValues": {"outcome": ["HIGH"]},
        "rules": [rule("odd", [], outcome="WEIRD"), rule("high", [], outcome="HIGH")],
    }
    assert evaluate(table, {}).rule_ids == ["high"]


def test_first_takes_the_first_match_in_rule_order():
    table = {
        "hitPolicy": "FIRST",
        "inputs": ["/actions/wait/status"],
        "rules": [
            rule("ok", ['"succeeded"'], to="off", outcome="DONE"),
            rule("other", ["-"], to="attention", outcome="REVIEW"),
        ],
    }
    done = evaluate(table, {"actions": {"wait": {"status": "succeeded"}}})
    assert (done.to, done.outcome, done.rule_ids) == ("off", "DONE", ["ok"])
    review = evaluate(table, {"actions": {"wait": {"status": "sent"}}})
    assert (review.to, review.outcome, review.rule_ids) == ("attention", "REVIEW", ["other"])


def test_a_missing_input_is_null_which_only_dash_and_null_match():
    table = {
        "hitPolicy": "FIRST",
        "inputs": ["/data/nothing/here"],
        "rules": [rule("small", ["< 10"], to="a"), rule("null", ["null"], to="b")],
    }
    assert evaluate(table, {"data": {}}).rule_ids == ["null"]


# Modelled on TCK 0008-LX: list tests in cells, and all matches in rule order.
def test_rule_order_returns_every_match_in_rule_order():
    table = {
        "hitPolicy": "RULE ORDER",
        "inputs": ["/data/plan"],
        "rules": [
            rule("backup", ['"pro", "business"'], to="ready", notice="backup"),
            rule("basic", ['not("free")'], to="ready", notice="welcome"),
            rule("all", ["-"], to="ready", notice="hello"),
        ],
    }
    result = evaluate(table, {"data": {"plan": "pro"}})
    assert result.rule_ids == ["backup", "basic", "all"]
    assert [m["notice"] for m in result.matches] == ["backup", "welcome", "hello"]
    assert result.outputs == result.matches[0]
    assert evaluate(table, {"data": {"plan": "free"}}).rule_ids == ["all"]


def test_output_order_sorts_matches_by_output_priority():
    table = {
        "hitPolicy": "OUTPUT ORDER",
        "inputs": ["/data/score"],
        "outputValues": {"to": ["review", "accepted"]},
        "rules": [
            rule("fine", [">= 0"], to="accepted"),
            rule("low", ["< 50"], to="review"),
        ],
    }
    result = evaluate(table, {"data": {"score": 10}})
    assert result.rule_ids == ["low", "fine"]
    assert result.to == "review"


FEES = {
    "hitPolicy": "COLLECT",
    "inputs": ["/data/disk", "/data/backup"],
    "rules": [
        rule("disk", ["> 100", "-"], fee=5),
        rule("backup", ["-", "true"], fee=3.5),
        rule("base", ["-", "-"], fee=10),
    ],
}


@pytest.mark.parametrize(
    ("aggregation", "value"), [("SUM", 18.5), ("MIN", 3.5), ("MAX", 10), ("COUNT", 3)]
)
def test_collect_aggregations(aggregation, value):
    result = evaluate({**FEES, "aggregation": aggregation}, {"data": {"disk": 200, "backup": True}})
    assert result.value == value
    assert result.rule_ids == ["disk", "backup", "base"]


def test_collect_without_aggregation_lists_every_match():
    result = evaluate(FEES, {"data": {"disk": 50, "backup": True}})
    assert result.matches == [{"fee": 3.5}, {"fee": 10}]
    assert result.value is None


def test_collect_aggregation_may_route_with_to_beside_its_single_output():
    table = {
        "hitPolicy": "COLLECT",
        "aggregation": "SUM",
        "inputs": [],
        "rules": [rule("a", [], to="billing", fee=1), rule("b", [], to="other", fee=2)],
    }
    result = evaluate(table, {})
    assert (result.to, result.value) == ("billing", 3)


def test_sum_over_text_outputs_is_an_invalid_table():
    table = {
        "hitPolicy": "COLLECT",
        "aggregation": "SUM",
        "inputs": [],
        "rules": [rule("a", [], x="1")],
    }
    with pytest.raises(DecisionError) as caught:
        evaluate(table, {})
    assert caught.value.code == "INVALID_TABLE"


@pytest.mark.parametrize("policy", HIT_POLICIES)
def test_no_match_is_an_error_for_every_policy(policy):
    table = {
        "hitPolicy": policy,
        "inputs": ["/data/x"],
        "outputValues": {"to": ["a"]},
        "rules": [rule("never", ['"y"'], to="a")],
    }
    with pytest.raises(DecisionError) as caught:
        evaluate(table, {"data": {"x": "z"}})
    assert caught.value.code == "NO_RULE_MATCHED"


def test_results_do_not_share_outputs_with_the_table():
    table = {"hitPolicy": "FIRST", "inputs": [], "rules": [rule("a", [], to="s", info=[1])]}
    evaluate(table, {}).outputs["info"].append(2)
    assert table["rules"][0]["then"]["info"] == [1]


def test_evaluate_refuses_a_broken_table():
    with pytest.raises(DecisionError) as caught:
        evaluate({"hitPolicy": "FIRST", "inputs": ["/x"], "rules": [rule("a", [], to="s")]}, {})
    assert caught.value.code == "INVALID_TABLE"


# --- printed result ---------------------------------------------------------------


def test_result_as_json_for_single_multi_and_aggregated_results():
    single = evaluate(APPROVAL_U, applicant(18, "Low", True))
    assert result_as_json(single) == {
        "hitPolicy": "UNIQUE",
        "ruleIds": ["approved"],
        "outputs": {"status": "Approved"},
    }
    multi = evaluate(FEES, {"data": {"disk": 1, "backup": False}})
    assert result_as_json(multi) == {
        "hitPolicy": "COLLECT",
        "ruleIds": ["base"],
        "matches": [{"fee": 10}],
    }
    counted = evaluate({**FEES, "aggregation": "COUNT"}, {"data": {"disk": 1, "backup": False}})
    assert result_as_json(counted)["value"] == 1


# --- publishing checks ------------------------------------------------------------


def paths(problems):
    return sorted(p.path for p in problems)


def test_check_table_accepts_the_tck_style_tables():
    for table in (APPROVAL_U, APPROVAL_A, APPROVAL_P, FEES):
        assert check_table(table) == ([], [])


@pytest.mark.parametrize(
    ("table", "bad_path"),
    [
        ({"hitPolicy": "SOME", "inputs": [], "rules": [rule("a", [])]}, "/t/hitPolicy"),
        ({"hitPolicy": "FIRST", "inputs": ["x"], "rules": [rule("a", ["-"])]}, "/t/inputs/0"),
        ({"hitPolicy": "FIRST", "inputs": [], "rules": []}, "/t/rules"),
        ({"hitPolicy": "FIRST", "inputs": ["/a"], "rules": [rule("a", [])]}, "/t/rules/0/when"),
        (
            {"hitPolicy": "FIRST", "inputs": ["/a"], "rules": [rule("a", ["<"])]},
            "/t/rules/0/when/0",
        ),
        (
            {"hitPolicy": "FIRST", "inputs": [], "rules": [rule("a", []), rule("a", [])]},
            "/t/rules/1/id",
        ),
        (
            {"hitPolicy": "FIRST", "inputs": [], "rules": [{"id": "a", "when": []}]},
            "/t/rules/0/then",
        ),
        (
            {
                "hitPolicy": "FIRST",
                "aggregation": "SUM",
                "inputs": [],
                "rules": [rule("a", [], x=1)],
            },
            "/t/aggregation",
        ),
        (
            {
                "hitPolicy": "COLLECT",
                "aggregation": "AVG",
                "inputs": [],
                "rules": [rule("a", [], x=1)],
            },
            "/t/aggregation",
        ),
        (
            {
                "hitPolicy": "COLLECT",
                "aggregation": "SUM",
                "inputs": [],
                "rules": [rule("a", [], x=1, y=2)],
            },
            "/t/aggregation",
        ),
        ({"hitPolicy": "PRIORITY", "inputs": [], "rules": [rule("a", [], x=1)]}, "/t/outputValues"),
        (
            {"hitPolicy": "OUTPUT ORDER", "inputs": [], "rules": [rule("a", [], x=1)]},
            "/t/outputValues",
        ),
    ],
)
def test_check_table_reports_structure_errors_at_their_path(table, bad_path):
    errors, _ = check_table(table, "/t")
    assert bad_path in paths(errors)


def test_unique_rules_that_provably_overlap_are_errors():
    table = {
        "hitPolicy": "UNIQUE",
        "inputs": ["/data/a", "/data/b"],
        "rules": [
            rule("x", ['"on"', "-"], to="s"),
            rule("y", ['"off"', "1"], to="s"),
            rule("z", ["-", "1"], to="s"),  # overlaps y (and x)
            rule("w", ["-", "[1..2]"], to="s"),  # a range: overlap is not proven
        ],
    }
    errors, _ = check_table(table)
    assert paths(errors) == ["/rules/2"]


def test_unique_rules_with_different_literals_do_not_overlap():
    table = {**APPROVAL_U, "rules": [rule("a", ["1", "-", "-"]), rule("b", ["2", "-", "-"])]}
    assert check_table(table)[0] == []


def test_unreachable_first_rules_are_warnings():
    table = {
        "hitPolicy": "FIRST",
        "inputs": ["/data/a"],
        "rules": [
            rule("one", ["< 5"], to="s"),
            rule("same", ["<5"], to="t"),
            rule("all", ["-"], to="u"),
            rule("after-all", ['"x"'], to="v"),
        ],
    }
    errors, warnings = check_table(table)
    assert errors == []
    assert paths(warnings) == ["/rules/1", "/rules/3"]


def test_outputs_missing_from_outputValues_are_warnings():
    table = {
        **APPROVAL_P,
        "rules": [*APPROVAL_P["rules"], rule("odd", ["-", "-", "-"], status="Maybe")],
    }
    assert paths(check_table(table)[1]) == ["/rules/3/then/status"]


# --- properties -------------------------------------------------------------------

_LITERALS = st.sampled_from(['"a"', '"b"', "1", "2.5", "-3", "true", "false", "null"])
_SIMPLE = st.one_of(
    _LITERALS,
    st.sampled_from(["<", "<=", ">", ">=", "="]).flatmap(
        lambda op: st.sampled_from(["1", '"b"', "0"]).map(lambda v: f"{op} {v}")
    ),
    st.sampled_from(["[1..2]", "(0..5]", "]-1..1[", '["a".."c")']),
)
_CELL = st.one_of(
    st.just("-"),
    st.lists(_SIMPLE, min_size=1, max_size=3).map(", ".join),
    st.lists(_SIMPLE, min_size=1, max_size=2).map(lambda ts: f"not({', '.join(ts)})"),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-3, 3) | st.sampled_from("abc"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xyz"), inner),
    max_leaves=8,
)
_INPUTS = st.lists(st.sampled_from(["/x", "/y", "/x/0", "/z/x"]), max_size=3)


_POLICIES = st.sampled_from(HIT_POLICIES)


@st.composite
def tables(draw, policies=_POLICIES):
    inputs = draw(_INPUTS)
    count = draw(st.integers(1, 5))
    rules = [
        {
            "id": f"r{i}",
            "when": [draw(_CELL) for _ in inputs],
            "then": {"to": draw(st.sampled_from("st")), "n": draw(st.integers(0, 3))},
        }
        for i in range(count)
    ]
    table = {"hitPolicy": draw(policies), "inputs": inputs, "rules": rules}
    table["outputValues"] = {"to": ["t", "s"]}
    if table["hitPolicy"] == "COLLECT" and draw(st.booleans()):
        table["aggregation"] = draw(st.sampled_from(["SUM", "MIN", "MAX", "COUNT"]))
    return table


@given(tables(), _JSON)
def test_evaluate_only_ever_raises_decision_errors(table, context):
    try:
        result = evaluate(table, context)
    except DecisionError as error:
        assert error.code in DecisionError.CODES
    else:
        assert isinstance(result, DecisionResult)
        assert result.rule_ids


def _ids_or_none(table, context):
    try:
        return evaluate(table, context).rule_ids
    except DecisionError as error:
        assert error.code == "NO_RULE_MATCHED"
        return None


@given(tables(st.just("FIRST")), _JSON)
def test_first_returns_the_first_match_of_rule_order(table, context):
    first = _ids_or_none(table, context)
    every = _ids_or_none({**table, "hitPolicy": "RULE ORDER"}, context)
    assert first == (every[:1] if every else None)


@given(tables(st.just("COLLECT")), _JSON)
def test_collect_contains_every_rule_that_matches_alone(table, context):
    table.pop("aggregation", None)
    collected = _ids_or_none(table, context) or []
    alone = [
        r["id"]
        for r in table["rules"]
        if _ids_or_none({**table, "hitPolicy": "FIRST", "rules": [r]}, context)
    ]
    assert collected == alone


# --- the static checks are linear, and say what the pairwise comparisons said ----------


def _pairwise_overlaps(table):
    """The UNIQUE overlap check as it was first written: every rule against every earlier one."""
    cells = [[parse_unary_tests(c) for c in rule["when"]] for rule in table["rules"]]

    def overlaps(a, b):
        for left, right in zip(a, b, strict=True):
            if left.is_any or right.is_any:
                other = right if left.is_any else left
                if not (other.is_any or other.single_literal):
                    return False
                continue
            if left.single_literal is None or right.single_literal is None:
                return False
            if not left.single_literal.matches(right.single_literal.value):
                return False
        return True

    found = []
    for j in range(len(cells)):
        first = next((i for i in range(j) if overlaps(cells[i], cells[j])), None)
        if first is not None:
            found.append((j, table["rules"][first]["id"]))
    return found


def _pairwise_unreachable(table):
    cells = [[parse_unary_tests(c) for c in rule["when"]] for rule in table["rules"]]
    found = []
    for j in range(1, len(cells)):
        for i in range(j):
            catch_all = all(cell.is_any for cell in cells[i])
            if catch_all or [c.signature for c in cells[i]] == [c.signature for c in cells[j]]:
                found.append((j, table["rules"][i]["id"]))
                break
    return found


_OVERLAP_CELL = st.one_of(st.just("-"), _LITERALS, st.sampled_from(["1.0", "= 1", "[1..2]"]))


@st.composite
def overlap_tables(draw, policy):
    inputs = draw(st.integers(0, 3))
    rules = [
        {"id": f"r{i}", "when": [draw(_OVERLAP_CELL) for _ in range(inputs)], "then": {"to": "s"}}
        for i in range(draw(st.integers(1, 8)))
    ]
    return {"hitPolicy": policy, "inputs": ["/x"] * inputs, "rules": rules}


@given(overlap_tables("UNIQUE"))
def test_unique_overlaps_are_the_ones_a_pairwise_comparison_finds(table):
    errors, _ = check_table(table)
    found = [(int(p.path.rsplit("/", 1)[1]), p.message.split("'")[1]) for p in errors]
    assert found == _pairwise_overlaps(table)


@given(overlap_tables("FIRST"))
def test_unreachable_first_rules_are_the_ones_a_pairwise_comparison_finds(table):
    _, warnings = check_table(table)
    found = [(int(p.path.rsplit("/", 1)[1]), p.message.split("'")[3]) for p in warnings]
    assert found == _pairwise_unreachable(table)


@pytest.mark.parametrize("text", ["1" * 101, "> " + "2" * 101, "[0.." + "3" * 5_000 + "]"])
def test_a_number_of_more_than_100_digits_is_an_invalid_table(text):
    with pytest.raises(DecisionError) as caught:
        parse_unary_tests(text)
    assert caught.value.code == "INVALID_TABLE"
    assert "at most 100 digits" in caught.value.message


def test_a_number_of_100_digits_is_read_exactly():
    assert parse_unary_tests("9" * 100).matches(10**100 - 1)


def test_tables_past_their_limits_are_invalid():
    table = {"hitPolicy": "FIRST", "inputs": ["/x"] * 33, "rules": [rule("a", ["-"] * 33)]}
    assert paths(check_table(table, "/t")[0]) == ["/t/inputs"]
    table = {"hitPolicy": "FIRST", "inputs": [], "rules": [rule(f"r{n}", []) for n in range(1001)]}
    assert paths(check_table(table, "/t")[0]) == ["/t/rules"]
    table = {"hitPolicy": "FIRST", "inputs": ["/x"], "rules": [rule("a", ['"' + "x" * 999 + '"'])]}
    assert paths(check_table(table, "/t")[0]) == ["/t/rules/0/when/0"]
    with pytest.raises(DecisionError):
        evaluate(table, {"x": "x"})
