"""Decision tables: S-FEEL unary tests and the DMN 1.3 hit policies, as pure functions."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orquestador.domain.errors import DecisionError
from orquestador.domain.limits import (
    MAX_CELL_CHARS,
    MAX_INPUTS,
    MAX_NUMBER_DIGITS,
    MAX_RULES,
    number_problems,
)
from orquestador.domain.mappings import find, pointer_parts
from orquestador.errors import Problem

SINGLE_HIT = ("UNIQUE", "FIRST", "PRIORITY", "ANY")
MULTI_HIT = ("COLLECT", "RULE ORDER", "OUTPUT ORDER")
HIT_POLICIES = SINGLE_HIT + MULTI_HIT
AGGREGATIONS = ("SUM", "MIN", "MAX", "COUNT")


# --- values -----------------------------------------------------------------


def _kind(value: Any) -> str:
    # FEEL keeps booleans apart from numbers; Python's bool is an int, so it
    # has to be tested first.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def same_value(left: Any, right: Any) -> bool:
    """Equality without JSON's cross-type surprises (true is not 1, "1" is not 1)."""
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(same_value(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(same_value, left, right))
    return _kind(left) == _kind(right) and left == right


# --- unary tests ------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    value: Any

    def matches(self, value: Any) -> bool:
        return same_value(self.value, value)

    @property
    def key(self) -> tuple[Any, ...]:
        return ("=", _kind(self.value), self.value)


@dataclass(frozen=True)
class Comparison:
    operator: str
    endpoint: Any

    def matches(self, value: Any) -> bool:
        # Ordering only exists between two numbers or two strings.
        if _kind(value) != _kind(self.endpoint):
            return False
        if self.operator == "<":
            return bool(value < self.endpoint)
        if self.operator == "<=":
            return bool(value <= self.endpoint)
        if self.operator == ">":
            return bool(value > self.endpoint)
        return bool(value >= self.endpoint)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.operator, _kind(self.endpoint), self.endpoint)


@dataclass(frozen=True)
class Range:
    low: Any
    high: Any
    low_closed: bool
    high_closed: bool

    def matches(self, value: Any) -> bool:
        if _kind(value) != _kind(self.low):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return bool(above and below)

    @property
    def key(self) -> tuple[Any, ...]:
        return ("..", _kind(self.low), self.low, self.high, self.low_closed, self.high_closed)


SimpleTest = Literal | Comparison | Range


@dataclass(frozen=True)
class UnaryTest:
    """A parsed table cell: ``-``, or a list of simple tests, possibly negated."""

    text: str
    tests: tuple[SimpleTest, ...] = ()
    negated: bool = False

    @property
    def is_any(self) -> bool:
        return not self.tests and not self.negated

    @property
    def single_literal(self) -> Literal | None:
        """The literal when the cell is exactly one equality test, else None."""
        if not self.negated and len(self.tests) == 1 and isinstance(self.tests[0], Literal):
            return self.tests[0]
        return None

    @property
    def signature(self) -> tuple[Any, ...]:
        """Equal for cells that test the same thing, however they are spelled."""
        return (self.negated, tuple(test.key for test in self.tests))

    def matches(self, value: Any) -> bool:
        if self.is_any:
            return True
        hit = any(test.matches(value) for test in self.tests)
        return not hit if self.negated else hit


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<range>\.\.)
      | (?P<number>-?(?:\d+(?:\.\d+)?|\.\d+))
      | (?P<op><=|>=|<|>|=)
      | (?P<word>[A-Za-z_]+)
      | (?P<punct>[\[\]\(\),])
    )""",
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_WORDS = {"true": True, "false": False, "null": None}


def _invalid(text: str, why: str) -> DecisionError:
    return DecisionError("INVALID_TABLE", f"cannot parse unary test {text!r}: {why}")


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:
            raise _invalid(text, f"unexpected character at position {position}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


def _unquote(text: str, quoted: str) -> str:
    out: list[str] = []
    chars = iter(quoted[1:-1])
    for char in chars:
        if char == "\\":
            escaped = next(chars)
            if escaped not in _ESCAPES:
                raise _invalid(text, f"unknown escape \\{escaped}")
            out.append(_ESCAPES[escaped])
        else:
            out.append(char)
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.position = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise _invalid(self.text, "unexpected end")
        self.position += 1
        return token

    def expect(self, value: str) -> None:
        token = self.take()
        if token[1] != value:
            raise _invalid(self.text, f"expected {value!r}, found {token[1]!r}")

    def literal(self) -> Any:
        kind, value = self.take()
        if kind == "string":
            return _unquote(self.text, value)
        if kind == "number":
            # Python refuses to read an integer of more than 4,300 digits; a table stops
            # far earlier, at the bound every number of a flow has.
            if sum(char.isdigit() for char in value) > MAX_NUMBER_DIGITS:
                raise _invalid(self.text, f"a number has at most {MAX_NUMBER_DIGITS} digits")
            return float(value) if "." in value else int(value)
        if kind == "word" and value in _WORDS:
            return _WORDS[value]
        raise _invalid(self.text, f"expected a literal, found {value!r}")

    def ordered_literal(self) -> Any:
        value = self.literal()
        if _kind(value) not in ("number", "string"):
            raise _invalid(self.text, "comparisons and ranges need a number or a string")
        return value

    def simple_test(self) -> SimpleTest:
        kind, value = self.peek() or ("", "")
        if kind == "op":
            self.take()
            if value == "=":
                return Literal(self.literal())
            return Comparison(value, self.ordered_literal())
        if value in ("[", "(", "]"):
            self.take()
            low = self.ordered_literal()
            self.expect("..")
            high = self.ordered_literal()
            if _kind(low) != _kind(high):
                raise _invalid(self.text, "both ends of a range must have the same type")
            end = self.take()[1]
            if end not in ("]", ")", "["):
                raise _invalid(self.text, f"a range ends with ], ) or [, not {end!r}")
            return Range(low, high, low_closed=value == "[", high_closed=end == "]")
        return Literal(self.literal())

    def test_list(self) -> tuple[SimpleTest, ...]:
        tests = [self.simple_test()]
        while self.peek() == ("punct", ","):
            self.take()
            tests.append(self.simple_test())
        return tuple(tests)

    def unary_tests(self) -> UnaryTest:
        if self.peek() == ("word", "not"):
            self.take()
            self.expect("(")
            tests = self.test_list()
            self.expect(")")
            result = UnaryTest(self.text, tests, negated=True)
        else:
            result = UnaryTest(self.text, self.test_list())
        extra = self.peek()
        if extra is not None:
            raise _invalid(self.text, f"unexpected {extra[1]!r}")
        return result


def parse_unary_tests(text: str) -> UnaryTest:
    """Parse one S-FEEL unary-tests cell; ``DecisionError`` INVALID_TABLE if malformed."""
    if not isinstance(text, str):
        raise DecisionError("INVALID_TABLE", f"a unary test is a string, not {text!r}")
    return _parse_cached(text)


# Tables are evaluated again on every transition; their cells repeat.
@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> UnaryTest:
    if text.strip() == "-":
        return UnaryTest(text)
    if text.strip() == "":
        raise _invalid(text, 'an empty cell is not a test; write "-" to match anything')
    return _Parser(text).unary_tests()


# --- table structure ----------------------------------------------------------


def _single_output_name(then: Mapping[str, Any]) -> str | None:
    # Aggregation needs one value per rule. The destination `to` is set aside
    # so that a flow table can still route while it aggregates another output.
    names = [name for name in then if name != "to"] or list(then)
    return names[0] if len(names) == 1 else None


def _structure_problems(table: Any, path: str) -> list[Problem]:
    """Problems that make a table impossible to evaluate."""
    if not isinstance(table, Mapping):
        return [Problem(path, "a decision table is an object")]
    problems: list[Problem] = []
    policy = table.get("hitPolicy")
    if policy not in HIT_POLICIES:
        known = ", ".join(HIT_POLICIES)
        problems.append(Problem(f"{path}/hitPolicy", f"unknown hit policy {policy!r}; use {known}"))
    inputs = table.get("inputs")
    if not isinstance(inputs, list):
        problems.append(Problem(f"{path}/inputs", "inputs is a list of JSON Pointers"))
        inputs = []
    if len(inputs) > MAX_INPUTS:
        return [Problem(f"{path}/inputs", f"a decision table has at most {MAX_INPUTS} inputs")]
    for i, pointer in enumerate(inputs):
        try:
            pointer_parts(pointer)
        except ValueError as exc:
            problems.append(Problem(f"{path}/inputs/{i}", str(exc)))
    rules = table.get("rules")
    if not isinstance(rules, list) or not rules:
        problems.append(Problem(f"{path}/rules", "a decision table needs at least one rule"))
        rules = []
    if len(rules) > MAX_RULES:
        return [Problem(f"{path}/rules", f"a decision table has at most {MAX_RULES} rules")]
    seen: set[str] = set()
    for r, rule in enumerate(rules):
        here = f"{path}/rules/{r}"
        if not isinstance(rule, Mapping):
            problems.append(Problem(here, "a rule is an object with id, when and then"))
            continue
        rule_id = rule.get("id")
        if not isinstance(rule_id, str) or not rule_id:
            problems.append(Problem(f"{here}/id", "a rule needs a non-empty string id"))
        elif rule_id in seen:
            problems.append(Problem(f"{here}/id", f"duplicate rule id {rule_id!r}"))
        else:
            seen.add(rule_id)
        when = rule.get("when")
        if not isinstance(when, list) or len(when) != len(inputs):
            problems.append(
                Problem(f"{here}/when", f"when needs one test per input ({len(inputs)})")
            )
        else:
            for c, cell in enumerate(when):
                if isinstance(cell, str) and len(cell) > MAX_CELL_CHARS:
                    message = f"a unary test has at most {MAX_CELL_CHARS} characters"
                    problems.append(Problem(f"{here}/when/{c}", message))
                    continue
                try:
                    parse_unary_tests(cell)
                except DecisionError as exc:
                    problems.append(Problem(f"{here}/when/{c}", exc.message))
        if not isinstance(rule.get("then"), Mapping):
            problems.append(Problem(f"{here}/then", "a rule needs then, an object of outputs"))
        else:
            problems.extend(number_problems(rule["then"], f"{here}/then"))
    problems.extend(_aggregation_problems(table, policy, rules, path))
    problems.extend(_output_value_problems(table, policy, path))
    return problems


def _aggregation_problems(
    table: Mapping[str, Any], policy: Any, rules: list[Any], path: str
) -> list[Problem]:
    if "aggregation" not in table:
        return []
    aggregation = table["aggregation"]
    here = f"{path}/aggregation"
    if aggregation not in AGGREGATIONS:
        return [Problem(here, f"unknown aggregation {aggregation!r}; use one of {AGGREGATIONS}")]
    if policy != "COLLECT":
        return [Problem(here, "aggregation is only allowed with the COLLECT hit policy")]
    names = {
        _single_output_name(rule["then"])
        for rule in rules
        if isinstance(rule, Mapping) and isinstance(rule.get("then"), Mapping)
    }
    if None in names or len(names) > 1:
        return [Problem(here, "aggregation needs every rule to give the same single output")]
    return []


def _output_value_problems(table: Mapping[str, Any], policy: Any, path: str) -> list[Problem]:
    here = f"{path}/outputValues"
    values = table.get("outputValues")
    if values is None:
        if policy in ("PRIORITY", "OUTPUT ORDER"):
            return [Problem(here, f"{policy} needs outputValues to rank the outputs")]
        return []
    if not isinstance(values, Mapping) or not values:
        return [Problem(here, "outputValues maps an output name to its values, highest first")]
    return [
        Problem(f"{here}/{name}", "the values of an output are a list")
        for name, listed in values.items()
        if not isinstance(listed, list)
    ]


def check_table(table: Any, path: str = "") -> tuple[list[Problem], list[Problem]]:
    """Check a decision table before it is published: (errors, warnings)."""
    errors = _structure_problems(table, path)
    if errors:
        return errors, []
    rules = table["rules"]
    cells = [[parse_unary_tests(cell) for cell in rule["when"]] for rule in rules]
    warnings = _unlisted_output_warnings(table, path)
    if table["hitPolicy"] == "UNIQUE":
        errors.extend(_unique_overlaps(rules, cells, path))
    if table["hitPolicy"] == "FIRST":
        warnings.extend(_unreachable_first_rules(rules, cells, path))
    return errors, warnings


def _literal_key(cell: UnaryTest) -> Any:
    """What a "-" or single-literal cell compares by: None for "-", else a hashable key."""
    if cell.is_any:
        return None
    literal = cell.single_literal
    assert literal is not None
    # same_value keeps kinds apart (true is not 1) but 5 equals 5.0, as their hashes do.
    return (_kind(literal.value), literal.value)


def _unique_overlaps(
    rules: list[Mapping[str, Any]], cells: list[list[UnaryTest]], path: str
) -> list[Problem]:
    """Each rule that surely overlaps an earlier one, with the first such rule.

    Only rules whose cells are all "-" or one literal are compared: for those,
    overlap is certain, whereas ranges and lists would need a solver to prove it.
    Two such rules overlap when every column has a "-" on either side or the same
    literal on both. Per column, a bit set of the rules that accept a literal (those
    with "-" there, or with that literal) makes each rule one AND per column rather
    than a comparison with every earlier rule.
    """
    simple = [
        r for r, row in enumerate(cells) if all(cell.is_any or cell.single_literal for cell in row)
    ]
    columns = len(cells[0]) if cells else 0
    anything = [0] * columns  # rules with "-" in the column
    literal: list[dict[Any, int]] = [{} for _ in range(columns)]  # literal -> rules with it
    keys = {r: [_literal_key(cell) for cell in cells[r]] for r in simple}
    everyone = 0
    for r in simple:
        everyone |= 1 << r
        for c, key in enumerate(keys[r]):
            if key is None:
                anything[c] |= 1 << r
            else:
                literal[c][key] = literal[c].get(key, 0) | 1 << r
    problems = []
    for j in simple:
        candidates = everyone & ((1 << j) - 1)
        for c, key in enumerate(keys[j]):
            if not candidates:
                break
            if key is not None:
                candidates &= anything[c] | literal[c].get(key, 0)
        if candidates:
            i = (candidates & -candidates).bit_length() - 1
            problems.append(
                Problem(
                    f"{path}/rules/{j}",
                    f"rules {rules[i]['id']!r} and {rules[j]['id']!r} match the same "
                    "inputs, which a UNIQUE table forbids",
                )
            )
    return problems


def _unreachable_first_rules(
    rules: list[Mapping[str, Any]], cells: list[list[UnaryTest]], path: str
) -> list[Problem]:
    """Rules after a rule of all "-", or after a rule with the same tests: one pass."""
    problems = []
    catch_all: int | None = None
    first_with: dict[tuple[Any, ...], int] = {}
    for j, row in enumerate(cells):
        signature = tuple(cell.signature for cell in row)
        same = first_with.setdefault(signature, j)
        earlier = [i for i in (catch_all, same) if i is not None and i < j]
        if earlier:
            i = min(earlier)
            problems.append(
                Problem(
                    f"{path}/rules/{j}",
                    f"rule {rules[j]['id']!r} can never be chosen: the earlier rule "
                    f"{rules[i]['id']!r} matches everything it matches",
                )
            )
        if catch_all is None and all(cell.is_any for cell in row):
            catch_all = j
    return problems


def _value_ranks(listed: list[Any]) -> dict[Any, int]:
    """The rank of each listed value (its first position), by a key that same_value agrees with."""
    ranks: dict[Any, int] = {}
    for rank, value in enumerate(listed):
        ranks.setdefault(_value_key(value), rank)
    return ranks


def _value_key(value: Any) -> Any:
    if isinstance(value, Mapping):
        return ("object", frozenset((k, _value_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_value_key(v) for v in value))
    return (_kind(value), value)


def _unlisted_output_warnings(table: Mapping[str, Any], path: str) -> list[Problem]:
    values = table.get("outputValues") or {}
    ranks = {name: _value_ranks(listed) for name, listed in values.items()}
    problems = []
    for r, rule in enumerate(table["rules"]):
        for name in values:
            if name in rule["then"] and _value_key(rule["then"][name]) not in ranks[name]:
                problems.append(
                    Problem(
                        f"{path}/rules/{r}/then/{name}",
                        f"{rule['then'][name]!r} is not listed in outputValues.{name}; "
                        "it ranks below every listed value",
                    )
                )
    return problems


# --- evaluation -------------------------------------------------------------


@dataclass(frozen=True)
class DecisionResult:
    """What a table chose for one context."""

    hit_policy: str
    rule_ids: list[str]
    outputs: dict[str, Any] | None
    matches: list[dict[str, Any]]
    value: Any = None
    aggregation: str | None = None

    @property
    def to(self) -> Any:
        return (self.outputs or {}).get("to")

    @property
    def outcome(self) -> Any:
        return (self.outputs or {}).get("outcome")

    @property
    def multi_hit(self) -> bool:
        return self.hit_policy in MULTI_HIT


def _priority_key(
    then: Mapping[str, Any],
    output_values: Mapping[str, list[Any]],
    ranks: Mapping[str, Mapping[Any, int]],
) -> list[int]:
    key = []
    for name, listed in output_values.items():
        rank = len(listed)  # unlisted or missing values rank after every listed one
        if name in then:
            rank = ranks[name].get(_value_key(then[name]), rank)
        key.append(rank)
    return key


def _aggregate(aggregation: str, matched: list[Mapping[str, Any]]) -> Any:
    if aggregation == "COUNT":
        return len(matched)
    values = []
    for rule in matched:
        name = _single_output_name(rule["then"])
        value = rule["then"][name]
        if _kind(value) != "number":
            raise DecisionError(
                "INVALID_TABLE",
                f"{aggregation} needs numbers; rule {rule['id']!r} gives {name}={value!r}",
            )
        values.append(value)
    if aggregation == "SUM":
        return sum(values)
    return min(values) if aggregation == "MIN" else max(values)


def evaluate(table: Mapping[str, Any], context: Mapping[str, Any]) -> DecisionResult:
    """Apply a decision table to a context, following the table's hit policy."""
    problems = _structure_problems(table, "")
    if problems:
        first = problems[0]
        raise DecisionError("INVALID_TABLE", f"{first.path or '/'}: {first.message}")
    policy: str = table["hitPolicy"]
    values = [find(context, pointer_parts(pointer))[1] for pointer in table["inputs"]]
    matched = [
        rule
        for rule in table["rules"]
        if all(
            parse_unary_tests(cell).matches(value)
            for cell, value in zip(rule["when"], values, strict=True)
        )
    ]
    if not matched:
        raise DecisionError("NO_RULE_MATCHED", "no rule of the decision table matched")

    ids = [rule["id"] for rule in matched]
    if policy == "UNIQUE" and len(matched) > 1:
        raise DecisionError(
            "HIT_POLICY_VIOLATION", f"UNIQUE table matched more than one rule: {ids}"
        )
    if policy == "ANY" and not all(same_value(r["then"], matched[0]["then"]) for r in matched):
        raise DecisionError(
            "HIT_POLICY_VIOLATION", f"ANY table matched rules with different outputs: {ids}"
        )
    if policy in ("PRIORITY", "OUTPUT ORDER"):
        # sorted() is stable: equal priorities keep rule order.
        output_values = table["outputValues"]
        ranks = {name: _value_ranks(listed) for name, listed in output_values.items()}
        matched.sort(key=lambda rule: _priority_key(rule["then"], output_values, ranks))

    aggregation = table.get("aggregation")
    value = _aggregate(aggregation, matched) if aggregation else None
    if policy in ("FIRST", "PRIORITY"):
        matched = matched[:1]
    # ANY keeps every agreeing rule id for the audit but reports one output.
    outputs = [copy.deepcopy(dict(rule["then"])) for rule in matched]
    return DecisionResult(
        hit_policy=policy,
        rule_ids=[rule["id"] for rule in matched],
        outputs=outputs[0],
        matches=outputs[:1] if policy in SINGLE_HIT else outputs,
        value=value,
        aggregation=aggregation,
    )


def result_as_json(result: DecisionResult) -> dict[str, Any]:
    """The object that ``orquestador decide`` prints for a result."""
    printed: dict[str, Any] = {"hitPolicy": result.hit_policy, "ruleIds": list(result.rule_ids)}
    if result.multi_hit:
        printed["matches"] = result.matches
    else:
        printed["outputs"] = result.outputs
    if result.aggregation:
        printed["aggregation"] = result.aggregation
        printed["value"] = result.value
    return printed


def decision_view(result: DecisionResult) -> dict[str, Any]:
    """What updates can read under ``/decision`` after a table decided."""
    view: dict[str, Any] = {
        "hitPolicy": result.hit_policy,
        "ruleIds": list(result.rule_ids),
        "outputs": copy.deepcopy(result.outputs),
        "matches": copy.deepcopy(result.matches),
    }
    if result.aggregation:
        view["value"] = result.value
    return view
