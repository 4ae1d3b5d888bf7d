"""What publishing checks an action against: its adapter's declared input and output schemas.

Only what can never succeed at run time is refused: a constant input its adapter's
schema rejects, an input name the schema forbids or a required one nobody maps, and a
read of an output field the adapter's output schema cannot have. Inputs bound from
request data stay run-time checks: their values are not known yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonpointer import JsonPointer

from orquestador.domain.mappings import array_index, find
from orquestador.domain.schemas import validator_for
from orquestador.errors import Problem

# Why a constant value of one input can never be accepted, beyond what the schema says
# (e.g. a machine command outside the operator's allow-list), or None.
ConstantProblem = Callable[[str, Any], str | None]

# Keywords whose effect on a field depends on other values or documents: a walk that
# meets one cannot tell what the field may be, so it assumes it may be anything.
_UNDECIDABLE = frozenset(
    {
        "$ref",
        "$dynamicRef",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "patternProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "prefixItems",
    }
)


@dataclass(frozen=True)
class ActionContract:
    """An adapter's declared contract, as a pure value the publishing check receives."""

    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None = None
    constant_problem: ConstantProblem | None = None
    # Its declared effect is READ_ONLY (None: not said).
    reads_only: bool | None = None


# The contract of (capability, version), or None when it is not known here.
ContractOf = Callable[[str, int], ActionContract | None]


def _segment(name: str) -> str:
    return JsonPointer.from_parts([name]).path


def input_problems(contract: ActionContract, inputs: Mapping[str, Any], at: str) -> list[Problem]:
    """Where an action's input mapping (at ``at``/input) can never satisfy its adapter."""
    schema = contract.input_schema
    problems: list[Problem] = []
    if not isinstance(schema, Mapping):
        return problems  # true or false: nothing to say per input
    properties = schema.get("properties")
    declared = properties if isinstance(properties, Mapping) else {}
    closed = schema.get("additionalProperties") is False and "patternProperties" not in schema
    for name in inputs:
        if closed and name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            problems.append(
                Problem(
                    f"{at}/input{_segment(name)}",
                    f"the adapter takes no input {name!r} (its inputs: {known})",
                )
            )
    required = schema.get("required")
    for name in required if isinstance(required, list) else ():
        if isinstance(name, str) and name not in inputs:
            problems.append(Problem(f"{at}/input", f"the adapter requires the input {name!r}"))
    constants = {
        name: source["const"]
        for name, source in inputs.items()
        if isinstance(source, Mapping) and "const" in source
    }
    if not constants:
        return problems
    # Only errors from a field's own subschema count: the other fields are missing here
    # and will be there at run time.
    try:
        errors = list(validator_for(schema).iter_errors(constants))
    except Exception:  # a schema publishing cannot evaluate: the run decides
        errors = []
    for error in errors:
        path, schema_path = list(error.absolute_path), list(error.schema_path)
        if not path or not schema_path or schema_path[0] != "properties":
            continue
        name = str(path[0])
        if name not in constants:
            continue
        where = f"{at}/input{_segment(name)}"
        inner = JsonPointer.from_parts([str(p) for p in path[1:]]).path
        problems.append(
            Problem(
                where,
                f"the constant{' at ' + inner if inner else ''} "
                f"can never be accepted: {_message(error.message)}",
            )
        )
    if contract.constant_problem is not None:
        for name, value in constants.items():
            message = contract.constant_problem(name, value)
            if message is not None:
                problems.append(Problem(f"{at}/input{_segment(name)}", message))
    return sorted(set(problems), key=lambda p: (p.path, p.message))


def _message(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def output_can_have(schema: Any, parts: Sequence[str]) -> bool:
    """Whether an output valid against ``schema`` may have a value at ``parts``.

    False only when the schema rules it out for every output: a closed object without
    that property, a scalar, a non-index into an array. Anything the walk cannot judge
    without the value (references, combinators, patterns) may be there.
    """
    current: Any = schema
    for i, token in enumerate(parts):
        if current is False:
            return False
        if not isinstance(current, Mapping) or _UNDECIDABLE & current.keys():
            return True
        if "const" in current or "enum" in current:
            # Only the listed values are valid: the read is possible if one of them has it.
            values = [current["const"]] if "const" in current else current["enum"]
            if not isinstance(values, list):
                return True
            return any(find(value, list(parts[i:]))[0] for value in values)
        types = current.get("type")
        kinds = {types} if isinstance(types, str) else set(types or ())
        if kinds and not kinds & {"object", "array"}:
            return False  # a scalar has no fields
        if kinds == {"array"}:
            if array_index(token) is None:
                return False
            current = current.get("items", True)
            continue
        if kinds != {"object"} and (kinds or array_index(token) is not None):
            # An object or an array (or an untyped value read by an index): the value decides.
            return True
        properties = current.get("properties")
        if isinstance(properties, Mapping) and token in properties:
            current = properties[token]
        else:
            current = current.get("additionalProperties", True)
    return current is not False
