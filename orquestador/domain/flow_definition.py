"""Flow definitions: validation before publishing, typed access, destinations and updates."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from jsonpointer import JsonPointer
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from orquestador.domain.decision import DecisionResult, check_table, decision_view, evaluate
from orquestador.domain.errors import DecisionError, MappingError, Problem
from orquestador.domain.mappings import pointer_parts, resolve_source, with_decision
from orquestador.domain.pointer_updates import schema_problems

CapabilityKnown = Callable[[str, int], bool]


@functools.cache
def _schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("flow_definition.schema.json").read_text("utf-8")
    return json.loads(text)


def definition_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) that every flow definition must satisfy."""
    return copy.deepcopy(_schema())


# --- validation -------------------------------------------------------------


def _pointer(parts: Sequence[Any]) -> str:
    return JsonPointer.from_parts([str(part) for part in parts]).path


def _schema_error_message(error: ValidationError) -> str:
    # The wrappers in the schema carry a sentence for combinators whose stock
    # message would print the whole offending object.
    if isinstance(error.schema, Mapping) and "errorMessage" in error.schema:
        return str(error.schema["errorMessage"])
    if error.validator == "type":
        return f"must be of type {error.validator_value}"
    if error.validator == "enum":
        return "must be one of " + ", ".join(json.dumps(v) for v in error.validator_value)
    return error.message if len(error.message) <= 300 else error.message[:297] + "..."


def _schema_errors(definition: Any) -> list[Problem]:
    validator = Draft202012Validator(_schema())
    problems = {
        Problem(_pointer(error.absolute_path), _schema_error_message(error))
        for error in validator.iter_errors(definition)
    }
    return sorted(problems, key=lambda p: (p.path, p.message))


def _read_problem(
    pointer: str, readable_actions: Sequence[str], *, decision: bool, earlier_only: bool = False
) -> str | None:
    """Why a mapping may not read ``pointer``, or None when it may."""
    try:
        parts = pointer_parts(pointer)
    except ValueError as exc:
        return str(exc)
    head = parts[0] if parts else None
    if head == "data":
        return None
    if head == "request" and parts[1:] in (["id"], ["state"]):
        return None
    if head == "actions" and len(parts) > 1:
        if parts[1] in readable_actions:
            return None
        which = "an earlier action" if earlier_only else "an action"
        return f"{pointer} reads {parts[1]!r}, which is not {which} of this transition"
    if head == "decision" and decision:
        return None
    allowed = "/data/..., /request/id, /request/state, /actions/<action>/..."
    if decision:
        allowed += ", /decision/..."
    return f"{pointer} reads outside the evaluation context; use {allowed}"


def _update_path_problem(path: str) -> str | None:
    try:
        parts = pointer_parts(path)
    except ValueError as exc:
        return str(exc)
    if not parts:
        return 'the empty pointer "" would replace the whole request data'
    if "-" in parts:
        return "'-' (append) is not allowed in an update path"
    return None


@dataclass
class _Report:
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def error(self, path: str, message: str | None) -> None:
        if message is not None:
            self.errors.append(Problem(path, message))


def _check_actions(
    transition: Mapping[str, Any],
    here: str,
    states: set[str],
    capability_known: CapabilityKnown | None,
    report: _Report,
) -> None:
    seen: list[str] = []
    for a, action in enumerate(transition["actions"]):
        at = f"{here}/actions/{a}"
        if action["id"] in seen:
            report.error(f"{at}/id", f"duplicate action id {action['id']!r} in this transition")
        if "onError" in action and action["onError"] not in states:
            report.error(f"{at}/onError", f"unknown state {action['onError']!r}")
        capability, version = action["capability"], action["version"]
        if capability_known is not None and not capability_known(capability, version):
            report.error(f"{at}/capability", f"unknown capability {capability} version {version}")
        if action.get("email") and capability != "notify":
            report.warnings.append(Problem(f"{at}/email", "email only applies to notify actions"))
        for name, source in action["input"].items():
            if "from" in source:
                where = f"{at}/input/{_pointer([name])[1:]}/from"
                problem = _read_problem(source["from"], seen, decision=False, earlier_only=True)
                report.error(where, problem)
        seen.append(action["id"])


def _check_decision(
    decision: Mapping[str, Any],
    here: str,
    states: set[str],
    action_ids: list[str],
    report: _Report,
) -> None:
    errors, warnings = check_table(decision, here)
    report.errors.extend(errors)
    report.warnings.extend(warnings)
    for i, pointer in enumerate(decision["inputs"]):
        report.error(f"{here}/inputs/{i}", _read_problem(pointer, action_ids, decision=False))
    for r, rule in enumerate(decision["rules"]):
        if rule["then"]["to"] not in states:
            report.error(f"{here}/rules/{r}/then/to", f"unknown state {rule['then']['to']!r}")


def _check_transition(
    transition: Mapping[str, Any],
    here: str,
    states: set[str],
    capability_known: CapabilityKnown | None,
    report: _Report,
) -> None:
    for k, state in enumerate(transition["from"]):
        if state not in states:
            report.error(f"{here}/from/{k}", f"unknown state {state!r}")
    if "to" in transition and transition["to"] not in states:
        report.error(f"{here}/to", f"unknown state {transition['to']!r}")
    _check_actions(transition, here, states, capability_known, report)
    action_ids = [action["id"] for action in transition["actions"]]
    decision = transition.get("decision")
    if decision is not None:
        _check_decision(decision, f"{here}/decision", states, action_ids, report)
    for u, update in enumerate(transition.get("updates", [])):
        report.error(f"{here}/updates/{u}/path", _update_path_problem(update["path"]))
        if "from" in update:
            problem = _read_problem(update["from"], action_ids, decision=decision is not None)
            report.error(f"{here}/updates/{u}/from", problem)


def validate_definition(
    definition: Any, capability_known: CapabilityKnown | None = None
) -> tuple[list[Problem], list[Problem]]:
    """Every problem that stops ``definition`` from being published, then warnings."""
    schema_errors = _schema_errors(definition)
    if schema_errors:
        # Semantic checks assume the shape the schema guarantees.
        return schema_errors, []
    report = _Report()
    report.errors.extend(schema_problems(definition["dataSchema"], "/dataSchema"))
    states = set(definition["states"])
    if definition["initialState"] not in states:
        report.error("/initialState", f"unknown state {definition['initialState']!r}")
    seen: set[str] = set()
    for t, transition in enumerate(definition["transitions"]):
        here = f"/transitions/{t}"
        if transition["id"] in seen:
            report.error(f"{here}/id", f"duplicate transition id {transition['id']!r}")
        seen.add(transition["id"])
        _check_transition(transition, here, states, capability_known, report)
    return report.errors, report.warnings


# --- typed access -----------------------------------------------------------


@dataclass(frozen=True)
class ActionSpec:
    """One action of a transition, as published."""

    id: str
    capability: str
    version: int
    input: dict[str, Any]
    on_error: str | None
    email: bool
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ActionSpec:
        return cls(
            id=raw["id"],
            capability=raw["capability"],
            version=raw["version"],
            input=dict(raw["input"]),
            on_error=raw.get("onError"),
            email=bool(raw.get("email", False)),
            raw=dict(raw),
        )


@dataclass(frozen=True)
class Transition:
    """One transition of a flow: where it leaves from, what it runs, where it goes."""

    id: str
    from_states: tuple[str, ...]
    actions: list[ActionSpec]
    to: str | None
    decision: dict[str, Any] | None
    updates: list[dict[str, Any]]
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Transition:
        return cls(
            id=raw["id"],
            from_states=tuple(raw["from"]),
            actions=[ActionSpec.from_json(action) for action in raw["actions"]],
            to=raw.get("to"),
            decision=raw.get("decision"),
            updates=list(raw.get("updates", [])),
            raw=dict(raw),
        )

    def leaves(self, state: str) -> bool:
        """Whether this transition may start from ``state``."""
        return state in self.from_states

    def action(self, action_id: str) -> ActionSpec | None:
        return next((action for action in self.actions if action.id == action_id), None)


@dataclass(frozen=True)
class FlowDefinition:
    """A published flow definition (already validated) with typed accessors."""

    key: str
    trigger: str
    data_schema: dict[str, Any]
    initial_state: str
    states: tuple[str, ...]
    transitions: dict[str, Transition]
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, definition: Mapping[str, Any]) -> FlowDefinition:
        return cls(
            key=definition["key"],
            trigger=definition["trigger"],
            data_schema=definition["dataSchema"],
            initial_state=definition["initialState"],
            states=tuple(definition["states"]),
            transitions={t["id"]: Transition.from_json(t) for t in definition["transitions"]},
            raw=dict(definition),
        )


# --- running a transition's pure parts -----------------------------------------


@dataclass(frozen=True)
class Decided:
    """The destination of a transition and, for a table, how it was chosen."""

    to: str
    outcome: str | None
    hit_policy: str | None
    rule_ids: list[str]
    result: DecisionResult | None


def decide_destination(transition: Transition, context: Mapping[str, Any]) -> Decided:
    """The fixed destination, or the one the transition's decision table chooses."""
    if transition.decision is None:
        if transition.to is None:
            raise DecisionError("INVALID_TABLE", f"transition {transition.id!r} has no destination")
        return Decided(transition.to, None, None, [], None)
    result = evaluate(transition.decision, context)
    if not isinstance(result.to, str) or not result.to:
        raise DecisionError(
            "INVALID_TABLE", f"rule {result.rule_ids[0]!r} gives no destination state 'to'"
        )
    outcome = result.outcome
    return Decided(
        to=result.to,
        outcome=None if outcome is None else str(outcome),
        hit_policy=result.hit_policy,
        rule_ids=list(result.rule_ids),
        result=result,
    )


def compute_updates(
    transition: Transition, context: Mapping[str, Any], decided: Decided | None = None
) -> list[tuple[str, Any]]:
    """The (path, value) writes of a transition, read from the evaluation context.

    Pass ``decided`` (or a context that already has ``decision``) so that
    updates can read ``/decision/...``.
    """
    if decided is not None and decided.result is not None and "decision" not in context:
        context = with_decision(context, decision_view(decided.result))
    writes = []
    for update in transition.updates:
        try:
            writes.append((update["path"], resolve_source(update, context)))
        except MappingError as exc:
            raise MappingError(f"update {update['path']}: {exc.message}") from None
    return writes
