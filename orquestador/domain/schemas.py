"""Data schemas written by flow authors: what publishing checks, the one way to validate with them.

A data schema is evaluated by the server on every request it checks, so it is
treated as untrusted code. Publishing refuses what could make validation reach
outside the document, recurse without end or run for long; validation itself
runs in a validator that cannot retrieve anything, runs regular expressions
with RE2, compares values by hashing rather than pairwise, and stops after a
bounded number of steps.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import unquote

import referencing
import referencing.exceptions
from jsonpointer import JsonPointer
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from orquestador.domain import limits, regexes
from orquestador.domain.canonical import canonical_json
from orquestador.domain.errors import DataSchemaError, DataValidationError
from orquestador.errors import Problem

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_DIALECTS = (DIALECT, DIALECT + "#")

Position = tuple[str, ...]  # the JSON Pointer tokens of a subschema inside its document

# Keywords holding subschemas, by what the subschemas apply to: the value itself
# (these can chain without end), its parts, or nothing until a reference names
# them. Each kind by the shape that holds them: one schema, a list, a map.
_SAME_VALUE = (("not", "if", "then", "else"), ("allOf", "anyOf", "oneOf"), ("dependentSchemas",))
_PARTS = (
    (
        "additionalProperties",
        "propertyNames",
        "items",
        "contains",
        "unevaluatedItems",
        "unevaluatedProperties",
    ),
    ("prefixItems",),
    ("properties", "patternProperties"),
)
_UNAPPLIED = (("contentSchema",), (), ("$defs", "definitions"))
_REFERENCES = ("$ref", "$dynamicRef")


def _pointer(parts: Position | tuple[Any, ...]) -> str:
    return JsonPointer.from_parts([str(part) for part in parts]).path


def _is_schema(value: Any) -> bool:
    return isinstance(value, dict | bool)


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[Position, Any, bool]]:
    """(relative position, subschema, applies to the same value) for each direct subschema."""
    for same, (singles, lists, maps) in ((True, _SAME_VALUE), (False, _PARTS), (False, _UNAPPLIED)):
        for keyword in singles:
            if _is_schema(schema.get(keyword)):
                yield (keyword,), schema[keyword], same
        for keyword in lists:
            if isinstance(schema.get(keyword), list):
                for i, item in enumerate(schema[keyword]):
                    if _is_schema(item):
                        yield (keyword, str(i)), item, same
        for keyword in maps:
            if isinstance(schema.get(keyword), dict):
                for name, item in schema[keyword].items():
                    if _is_schema(item):
                        yield (keyword, name), item, same


@dataclass
class _Document:
    """The subschemas of one schema document and which of them apply to one value."""

    positions: dict[Position, Any] = field(default_factory=dict)
    # position -> (position applied to the same value, position of the keyword that does it)
    same_value: dict[Position, list[tuple[Position, Position]]] = field(default_factory=dict)
    # references that stay out of same_value because they name no schema here
    bad_references: list[Problem] = field(default_factory=list)

    @classmethod
    def of(cls, schema: Any) -> _Document:
        document = cls()
        stack: list[tuple[Position, Any]] = [((), schema)]
        while stack:
            position, subschema = stack.pop()
            document.positions[position] = subschema
            if not isinstance(subschema, dict):
                continue
            for relative, child, same in _subschemas(subschema):
                stack.append(((*position, *relative), child))
                if same:
                    edge = ((*position, *relative), (*position, relative[0]))
                    document.same_value.setdefault(position, []).append(edge)
        # References last: a target is known only once every position is.
        for position, subschema in list(document.positions.items()):
            for keyword in _REFERENCES if isinstance(subschema, dict) else ():
                if keyword not in subschema:
                    continue
                target = _reference_target(subschema[keyword], document)
                if isinstance(target, str):
                    document.bad_references.append(Problem(_pointer((*position, keyword)), target))
                else:
                    edge = (target, (*position, keyword))
                    document.same_value.setdefault(position, []).append(edge)
        return document


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _reference_target(reference: Any, document: _Document) -> Position | str:
    """The position a reference names, or why it may not be used."""
    if not isinstance(reference, str) or not reference.startswith("#"):
        return (
            f"{_quoted(reference)} is not a reference inside this schema: only JSON Pointer "
            'fragments such as "#/$defs/name" are allowed, never a URL or a file'
        )
    fragment = reference[1:]
    if fragment == "":
        return ()
    if not fragment.startswith("/"):
        return f'{_quoted(reference)} names an anchor; use a JSON Pointer such as "#/$defs/name"'
    # As the resolver reads it: percent-decoded first, then split and unescaped.
    tokens = tuple(
        token.replace("~1", "/").replace("~0", "~") for token in unquote(fragment[1:]).split("/")
    )
    if tokens not in document.positions:
        return f"{_quoted(reference)} does not point at a schema in this document"
    return tokens


def _keyword_problems(document: _Document) -> list[Problem]:
    problems = list(document.bad_references)
    for position, schema in document.positions.items():
        if not isinstance(schema, dict):
            continue
        if "$schema" in schema:
            if position != ():
                problems.append(
                    Problem(_pointer((*position, "$schema")), "$schema is only allowed at the top")
                )
            elif schema["$schema"] not in _DIALECTS:
                problems.append(
                    Problem("/$schema", f"only JSON Schema draft 2020-12 ({DIALECT}) is supported")
                )
        if "$id" in schema and position != ():
            problems.append(
                Problem(
                    _pointer((*position, "$id")),
                    "$id is only allowed at the top: a nested $id starts another document, "
                    "and references must stay in this one",
                )
            )
        if isinstance(schema.get("pattern"), str):
            reason = regexes.pattern_problem(schema["pattern"])
            if reason:
                problems.append(Problem(_pointer((*position, "pattern")), reason))
        if isinstance(schema.get("patternProperties"), dict):
            for pattern in schema["patternProperties"]:
                reason = regexes.pattern_problem(pattern)
                if reason:
                    where = _pointer((*position, "patternProperties", pattern))
                    problems.append(Problem(where, reason))
    return problems


def _chain_problems(document: _Document) -> list[Problem]:
    """Cycles of schemas applied to one value (endless recursion), then chains too long.

    A depth-first search over the same-value edges, without recursion: a back edge
    closes a cycle, reported at the first reference on it (every cycle has one,
    since the other edges always lead deeper into the document).
    """
    edges = document.same_value
    longest: dict[Position, int] = {}
    on_stack: dict[Position, int] = {}
    cycles: dict[str, Problem] = {}
    for start in document.positions:
        if start in longest:
            continue
        stack: list[tuple[Position, Iterator[tuple[Position, Position]]]] = [
            (start, iter(edges.get(start, [])))
        ]
        taken: list[Position] = []  # the keyword of each edge on the stack
        on_stack[start] = 0
        while stack:
            node, pending = stack[-1]
            for target, keyword in pending:
                if target in on_stack:
                    loop = [*taken[on_stack[target] :], keyword]
                    at = next(k for k in loop if k[-1] in _REFERENCES)
                    cycles.setdefault(
                        _pointer(at),
                        Problem(
                            _pointer(at),
                            "this reference leads back to a schema it is applied from, "
                            "without descending into the value: validation would never end",
                        ),
                    )
                elif target not in longest:
                    on_stack[target] = len(stack)
                    stack.append((target, iter(edges.get(target, []))))
                    taken.append(keyword)
                    break
            else:
                stack.pop()
                del on_stack[node]
                if taken:
                    taken.pop()
                done = [longest[t] for t, _ in edges.get(node, []) if t in longest]
                longest[node] = 1 + max(done) if done else 0
    if cycles:
        return sorted(cycles.values(), key=lambda p: p.path)
    deepest = max(document.positions, key=lambda p: longest.get(p, 0))
    if longest.get(deepest, 0) > limits.MAX_SCHEMA_CHAIN:
        return [
            Problem(
                _pointer(deepest),
                f"applies a chain of {longest[deepest]} schemas to one value through $ref, "
                "allOf, anyOf, oneOf, not, if/then/else or dependentSchemas; "
                f"the limit is {limits.MAX_SCHEMA_CHAIN}",
            )
        ]
    return []


def _unevaluated_problems(document: _Document) -> list[Problem]:
    # jsonschema finds the properties that unevaluatedProperties leaves out with
    # Python's own regular expressions, which can backtrack for ever: the two are
    # not combined, so every pattern of a data schema runs in RE2. One search
    # backwards from every patternProperties finds each schema that applies one.
    applied_from: dict[Position, list[Position]] = {}
    for position, edges in document.same_value.items():
        for target, _ in edges:
            applied_from.setdefault(target, []).append(position)
    witness: dict[Position, Position] = {}
    stack = []
    for position, schema in document.positions.items():
        if isinstance(schema, dict) and "patternProperties" in schema:
            witness[position] = position
            stack.append(position)
    while stack:
        position = stack.pop()
        for source in applied_from.get(position, []):
            if source not in witness:
                witness[source] = witness[position]
                stack.append(source)
    return [
        Problem(
            _pointer((*position, "unevaluatedProperties")),
            "unevaluatedProperties cannot be combined with patternProperties "
            f"(at {_pointer((*witness[position], 'patternProperties'))}); use "
            "additionalProperties instead",
        )
        for position, schema in document.positions.items()
        if isinstance(schema, dict) and "unevaluatedProperties" in schema and position in witness
    ]


@functools.cache
def _meta_validator() -> Validator:
    # Building a validator resolves the meta-schema's vocabularies; do it once.
    return Draft202012Validator(Draft202012Validator.META_SCHEMA)


def _bounds_problems(schema: Any) -> list[Problem]:
    depth = limits.depth_problem(schema, limits.MAX_SCHEMA_DEPTH)
    if depth is not None:
        return [depth]
    numbers = limits.number_problems(schema)
    if numbers:
        return numbers
    try:
        size = len(canonical_json(schema))
    except (TypeError, ValueError) as exc:
        return [Problem("", f"a data schema is JSON: {exc}")]
    if size > limits.MAX_SCHEMA_BYTES:
        limit = limits.MAX_SCHEMA_BYTES
        return [Problem("", f"is {size} bytes as JSON; a data schema has at most {limit}")]
    return []


def schema_problems(schema: Any, prefix: str = "") -> list[Problem]:
    """Every reason ``schema`` may not be published as a data schema, each at its path.

    Sizes and numbers come first, since they bound the cost of the rest; then the
    draft 2020-12 meta-schema; then what this server adds: references stay inside
    the document and point at a schema, no chain of schemas applied to one value
    loops or runs too long, and every regular expression compiles in RE2.
    """
    problems = _bounds_problems(schema)
    if not problems:
        errors = _meta_validator().iter_errors(schema)
        problems = [
            Problem(_pointer(tuple(e.absolute_path)), f"invalid JSON Schema: {e.message}")
            for e in errors
        ]
    if not problems and isinstance(schema, dict):
        document = _Document.of(schema)
        problems = _keyword_problems(document)
        problems += _unevaluated_problems(document)
        if not problems:
            problems = _chain_problems(document)
    problems = [Problem(prefix + p.path, p.message) for p in problems]
    return sorted(set(problems), key=lambda p: (p.path, p.message))


# --- validation ---------------------------------------------------------------------


class _StepsExhausted(Exception):
    """Validation went past its budget of steps or of processor time."""


@dataclass
class _Budget:
    steps: int
    deadline: float  # of time.thread_time(): time spent waiting for the GIL does not count
    until_clock: int = 0


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "schema_budget", default=None
)
_CLOCK_EVERY = 1024  # steps between two readings of the clock


def _spend(steps: int = 1) -> None:
    budget = _budget.get()
    if budget is None:
        return
    budget.steps -= steps
    budget.until_clock -= steps
    if budget.steps < 0:
        raise _StepsExhausted
    if budget.until_clock <= 0:
        budget.until_clock = _CLOCK_EVERY
        if time.thread_time() > budget.deadline:
            raise _StepsExhausted


def _json_key(value: Any) -> Any:
    """A hashable key equal for values that JSON Schema calls equal (1 and 1.0, not 1 and true)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z",)
    if isinstance(value, list):
        return ("a", tuple(_json_key(item) for item in value))
    if isinstance(value, dict):
        return ("o", frozenset((key, _json_key(item)) for key, item in value.items()))
    return ("?", id(value))


class _EnumKeys:
    """The keys of recently used enum lists, so membership is one lookup, not a scan."""

    def __init__(self, size: int = 1024) -> None:
        self._keys: OrderedDict[int, tuple[list[Any], frozenset[Any]]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def of(self, enums: list[Any]) -> frozenset[Any]:
        with self._lock:
            found = self._keys.get(id(enums))
            # The list is kept alive with its keys, so its id cannot name another list.
            if found is not None and found[0] is enums:
                self._keys.move_to_end(id(enums))
                return found[1]
        keys = frozenset(_json_key(each) for each in enums)
        with self._lock:
            self._keys[id(enums)] = (enums, keys)
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)
        return keys


_ENUM_KEYS = _EnumKeys()


def _cannot_check(keyword: str, why: object) -> ValidationError:
    return ValidationError(f"{keyword} cannot be checked: {why}")


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        found = regexes.search(pattern, instance)
    except regexes.RegexError as exc:
        yield _cannot_check("pattern", exc)
        return
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _matching(patterns: Any, name: str) -> bool:
    for pattern in patterns:
        try:
            if regexes.search(pattern, name):
                return True
        except regexes.RegexError:
            continue  # reported by patternProperties itself
    return False


def _pattern_properties(
    validator: Any, pattern_properties: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        _spend(len(instance))
        try:
            compiled = regexes.compile_pattern(pattern)
        except regexes.RegexError as exc:
            yield _cannot_check("patternProperties", exc)
            continue
        for name, value in instance.items():
            if compiled.search(name) is not None:
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema's own version matches patternProperties with Python's re.
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    _spend(len(instance) * max(1, len(patterns)))
    extras = [name for name in instance if name not in properties and not _matching(patterns, name)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = sorted(extras)
        if "patternProperties" in schema:
            verb = "does" if len(names) == 1 else "do"
            joined = ", ".join(repr(each) for each in names)
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            verb = "was" if len(names) == 1 else "were"
            joined = ", ".join(repr(each) for each in names)
            message = f"Additional properties are not allowed ({joined} {verb} unexpected)"
            yield ValidationError(message)


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema compares objects pairwise: 20,000 of them took minutes.
    if not unique or not validator.is_type(instance, "array"):
        return
    _spend(len(instance))
    seen: set[Any] = set()
    for item in instance:
        key = _json_key(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not isinstance(enums, list):
        return
    if _json_key(instance) not in _ENUM_KEYS.of(enums):
        yield ValidationError(f"{instance!r} is not one of {enums!r}")


def _multiple_of(
    validator: Any, factor: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    stock = Draft202012Validator.VALIDATORS["multipleOf"]
    try:
        errors = list(stock(validator, factor, instance, schema) or ())
    except ArithmeticError as exc:
        errors = [_cannot_check("multipleOf", exc)]
    yield from errors


_SAFE_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "enum": _enum,
    "multipleOf": _multiple_of,
}


def _counted(keyword: Any) -> Any:
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend()
        return keyword(validator, value, instance, schema)

    return counted


def _regex_format(instance: object) -> bool:
    if isinstance(instance, str):
        regexes.compile_pattern(instance)
    return True


def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    # A string that claims to be a regex is one this server could run.
    checker.checks("regex", raises=regexes.RegexError)(_regex_format)
    return checker


_FORMATS = _format_checker()

# jsonschema's `extend` is untyped: the class it makes is typed here, as a Validator's.
_SafeValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={
        name: _counted(_SAFE_KEYWORDS.get(name, keyword))
        for name, keyword in Draft202012Validator.VALIDATORS.items()
    },
)


def _retrieve_nothing(uri: str) -> NoReturn:
    # jsonschema's default registry fetches remote references; nothing is fetched here.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


_NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


def _without_dialects(schema: Any) -> Any:
    """``schema`` (a private copy) with every $schema removed.

    jsonschema picks the validator class of each subschema from its $schema, so a
    subschema naming a dialect, even 2020-12 itself, would leave the safe keywords
    behind. Publishing allows $schema only at the top and only as 2020-12, the
    dialect this validator is, so nothing is lost by removing it.
    """
    for subschema in _Document.of(schema).positions.values():
        if isinstance(subschema, dict):
            subschema.pop("$schema", None)
    return schema


@functools.lru_cache(maxsize=256)
def _validator_from_json(schema_json: str) -> Validator:
    schema = _without_dialects(json.loads(schema_json))
    return _SafeValidator(schema, registry=_NO_RETRIEVAL, format_checker=_FORMATS)


def _schema_key(schema: Any) -> str | None:
    # Key order is kept (not sorted) so that messages quoting parts of the schema read
    # exactly as they would for the caller's own document.
    try:
        key = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None  # not JSON: nothing sound to cache it under
    return key if json.loads(key) == schema else None  # e.g. non-string keys


def validator_for(schema: Any) -> Validator:
    """The validator of ``schema``: the one way this server builds one, cached per schema.

    It retrieves nothing (a reference outside the document is unresolvable), runs
    patterns in RE2, asserts formats, and counts its steps when run through
    ``instance_errors``. Build every validator of content that is not this
    server's own code here.
    """
    key = _schema_key(schema)
    if key is None:
        copied = _without_dialects(copy.deepcopy(schema))
        return _SafeValidator(copied, registry=_NO_RETRIEVAL, format_checker=_FORMATS)
    return _validator_from_json(key)


@functools.lru_cache(maxsize=256)
def _problems_from_json(schema_json: str) -> tuple[Problem, ...]:
    return tuple(schema_problems(json.loads(schema_json), "/dataSchema"))


def data_validator(schema: Any) -> Validator:
    """The validator of a flow's data schema; ``DataSchemaError`` if it could not be published.

    Checked again here, once per distinct schema, because a flow stored before a
    check existed is still used to create requests.
    """
    key = _schema_key(schema)
    problems = schema_problems(schema, "/dataSchema") if key is None else _problems_from_json(key)
    if problems:
        raise DataSchemaError(list(problems))
    return validator_for(schema)


def instance_errors(
    validator: Validator,
    instance: Any,
    max_steps: int = limits.MAX_VALIDATION_STEPS,
    max_seconds: float = limits.MAX_VALIDATION_SECONDS,
) -> list[ValidationError]:
    """Every error of ``instance``, in path order, within a budget of steps and processor time.

    A step is one keyword applied to one value (or one item or property for the
    keywords that loop). ``DataValidationError`` when checking would take longer or
    nest deeper than Python allows; ``DataSchemaError`` when a reference cannot be
    resolved.
    """
    token = _budget.set(_Budget(steps=max_steps, deadline=time.thread_time() + max_seconds))
    try:
        errors = list(validator.iter_errors(instance))
    except _StepsExhausted:
        raise DataValidationError(
            [
                Problem(
                    "",
                    f"checking this value against the schema takes more than {max_steps} "
                    f"steps or {max_seconds:g} s: the schema's alternatives multiply with "
                    "the depth or size of the value",
                )
            ]
        ) from None
    except RecursionError:
        raise DataValidationError(
            [Problem("", "the value nests too deeply to be checked against this schema")]
        ) from None
    except referencing.exceptions.Unresolvable as exc:
        raise DataSchemaError([Problem("/dataSchema", f"unresolvable reference {exc}")]) from None
    finally:
        _budget.reset(token)
    return sorted(errors, key=lambda e: (_pointer(tuple(e.absolute_path)), e.message))
