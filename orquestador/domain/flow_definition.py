"""Flow definitions: validation before publishing, typed access, destinations and updates."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, cast

from jsonpointer import JsonPointer
from jsonschema.exceptions import ValidationError

from orquestador.domain.action_contracts import (
    ActionContract,
    ContractOf,
    input_problems,
    output_can_have,
)
from orquestador.domain.concurrency import DEFAULT_PRIORITY, Concurrency, key_pointer_problem
from orquestador.domain.continuations import (
    continuation_problems,
    cycle_warnings,
    declared,
    writes_after_approval,
)
from orquestador.domain.decision import DecisionResult, check_table, decision_view, evaluate
from orquestador.domain.errors import DecisionError, MappingError
from orquestador.domain.limits import number_problems
from orquestador.domain.mappings import (
    MAX_FORMAT_PLACEHOLDERS,
    format_placeholders,
    pointer_parts,
    resolve_source,
    with_decision,
)
from orquestador.domain.pointer_updates import update_path_problem
from orquestador.domain.schemas import schema_problems, validator_for
from orquestador.errors import Problem

# Why a flow may not name (capability, version), or None when it may: the adapter
# registry's answer, which this pure module receives instead of importing.
CapabilityProblem = Callable[[str, int], str | None]

# The triggers a platform event fires (a plan binds one flow per moment). Such a flow
# names the transition an event starts, since nobody is there to pick one.
MOMENT_TRIGGERS = ("provisioned", "reinstalled", "deleted")
# Actions whose e-mail is switched on by the node's own `"email": true` (SPEC 17).
EMAIL_CAPABILITIES = ("notify", "approval")
# A schedule's fires start its flow, and nobody is there to pick a transition either.
SCHEDULE_TRIGGER = "schedule"
# The triggers whose flows name the transition they start in "start".
STARTED_TRIGGERS = (*MOMENT_TRIGGERS, SCHEDULE_TRIGGER)


@functools.cache
def _schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("flow_definition.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


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
        allowed = cast(list[Any], error.validator_value)
        return "must be one of " + ", ".join(json.dumps(v) for v in allowed)
    message: str = error.message
    return message if len(message) <= 300 else message[:297] + "..."


_BOUNDED_NUMBERS = {"$ref": "#/$defs/boundedNumbers"}


@functools.cache
def _checked_schema() -> dict[str, Any]:
    # The schema states the bound on numbers for its readers, as a schema applied to
    # every value; the server checks the same bound in one walk, which halves the cost
    # of validating a large definition.
    schema = definition_schema()
    schema["allOf"] = [part for part in schema["allOf"] if part != _BOUNDED_NUMBERS]
    return schema


def _schema_errors(definition: Any) -> list[Problem]:
    validator = validator_for(_checked_schema())
    problems = {
        Problem(_pointer(error.absolute_path), _schema_error_message(error))
        for error in validator.iter_errors(definition)
    }
    problems.update(number_problems(definition))
    return sorted(problems, key=lambda p: (p.path, p.message))


def _read_problem(
    pointer: str,
    readable_actions: Sequence[str],
    *,
    decision: bool,
    earlier_only: bool = False,
    outputs: Mapping[str, Any] | None = None,
) -> str | None:
    """Why a mapping may not read ``pointer``, or None when it may.

    ``outputs`` holds the declared output schema of each action known to have one: a
    read of a field that schema rules out could never resolve.
    """
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
            schema = (outputs or {}).get(parts[1])
            if schema is None or output_can_have(schema, parts[2:]):
                return None
            return (
                f"{pointer} reads a field the output of {parts[1]!r} cannot have"
                " (its adapter's output schema rules it out)"
            )
        which = "an earlier action" if earlier_only else "an action"
        return f"{pointer} reads {parts[1]!r}, which is not {which} of this transition"
    if head == "decision" and decision:
        return None
    allowed = "/data/..., /request/id, /request/state, /actions/<action>/..."
    if decision:
        allowed += ", /decision/..."
    return f"{pointer} reads outside the evaluation context; use {allowed}"


@dataclass
class _Report:
    """The problems found so far, and which parts of the definition the schema accepted."""

    schema_errors: list[Problem]
    states: set[str] | None
    capability_problem: CapabilityProblem | None
    contract_of: ContractOf | None = None
    # The flow's dataSchema when it is one (a concurrency key is read from the data).
    data_schema: Any = None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    # Each path the schema found a problem at, and every path above one: `shaped`
    # is asked for every part of a definition, so it must not scan the errors.
    _troubled: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for problem in self.schema_errors:
            path = problem.path
            while path not in self._troubled:
                self._troubled.add(path)
                if not path:
                    break
                path = path[: path.rindex("/")]

    def error(self, path: str, message: str | None) -> None:
        if message is not None:
            self.errors.append(Problem(path, message))

    def shaped(self, path: str) -> bool:
        """Whether the schema found nothing wrong at or under ``path``.

        A semantic check runs on each part that has the shape it assumes, so a
        problem in one part never hides a problem in another.
        """
        return path not in self._troubled

    def unknown_state(self, path: str, state: Any) -> None:
        # Without a usable list of states no name can be called unknown.
        if self.states is not None and isinstance(state, str) and state not in self.states:
            self.error(path, f"unknown state {state!r}")


def _items(container: Mapping[str, Any], name: str) -> list[tuple[int, Any]]:
    """The entries of an optional array field (none when absent or not an array)."""
    value = container.get(name, [])
    return list(enumerate(value)) if isinstance(value, list) else []


def _check_action(
    action: Mapping[str, Any],
    at: str,
    seen: list[str],
    outputs: dict[str, Any],
    report: _Report,
) -> None:
    if report.shaped(f"{at}/id") and action.get("id") in seen:
        report.error(f"{at}/id", f"duplicate action id {action['id']!r} in this transition")
    if report.shaped(f"{at}/onError"):
        report.unknown_state(f"{at}/onError", action.get("onError"))
    capability = action.get("capability")
    if (
        report.capability_problem is not None
        and "capability" in action
        and "version" in action
        and report.shaped(f"{at}/capability")
        and report.shaped(f"{at}/version")
    ):
        problem = report.capability_problem(action["capability"], action["version"])
        report.error(f"{at}/capability", problem)
    if action.get("email") is True and capability not in EMAIL_CAPABILITIES:
        report.warnings.append(
            Problem(f"{at}/email", "email only applies to notify and approval actions")
        )
    inputs = action.get("input")
    for name, source in inputs.items() if isinstance(inputs, Mapping) else ():
        where = f"{at}/input/{_pointer([name])[1:]}"
        if report.shaped(where) and "from" in source:
            problem = _read_problem(
                source["from"], seen, decision=False, earlier_only=True, outputs=outputs
            )
            report.error(f"{where}/from", problem)
        if report.shaped(where) and "format" in source:
            report.error(f"{where}/format", _format_problem(source["format"], report.data_schema))
    if capability in EMAIL_CAPABILITIES and isinstance(inputs, Mapping) and "email" in inputs:
        # One switch (SPEC 17): the opt-in lives on the node, where the page shows it.
        report.error(
            f"{at}/input/email",
            f'e-mail is switched on by the action\'s own field {at}/email ("email": true),'
            " not by an input",
        )
    contract = _contract(action, at, report)
    if contract is None:
        return
    if isinstance(inputs, Mapping) and report.shaped(f"{at}/input"):
        report.errors.extend(input_problems(contract, inputs, at))
    if report.shaped(f"{at}/id") and isinstance(action.get("id"), str):
        outputs[action["id"]] = contract.output_schema


def _format_problem(template: str, data_schema: Any) -> str | None:
    """Why a format cannot give its text at run time, or None."""
    try:
        pointers = format_placeholders(template)
    except ValueError as exc:
        return str(exc)
    if len(pointers) > MAX_FORMAT_PLACEHOLDERS:
        return f"at most {MAX_FORMAT_PLACEHOLDERS} {{/data/...}} in one format"
    for pointer in pointers:
        parts = pointer_parts(pointer)
        if data_schema is not None and not output_can_have(data_schema, parts[1:]):
            return f"{{{pointer}}} reads a field the flow's dataSchema rules out"
    return None


def _contract(action: Mapping[str, Any], at: str, report: _Report) -> ActionContract | None:
    """The adapter contract of a well-formed, known action, or None."""
    if report.contract_of is None:
        return None
    capability, version = action.get("capability"), action.get("version")
    if not (report.shaped(f"{at}/capability") and report.shaped(f"{at}/version")):
        return None
    if not isinstance(capability, str) or not isinstance(version, int):
        return None
    if report.capability_problem is not None and report.capability_problem(capability, version):
        return None
    return report.contract_of(capability, version)


def _check_actions(
    transition: Mapping[str, Any], here: str, outputs: dict[str, Any], report: _Report
) -> list[str]:
    """Check each action; the ids of the transition's actions, in order.

    ``outputs`` receives the declared output schema of each action whose adapter is known.
    """
    seen: list[str] = []
    for a, action in _items(transition, "actions"):
        if not isinstance(action, Mapping):
            continue
        _check_action(action, f"{here}/actions/{a}", seen, outputs, report)
        # A well-formed id is readable by later actions even if its action has
        # other problems: calling those reads unknown would be a false report.
        if report.shaped(f"{here}/actions/{a}/id") and "id" in action:
            seen.append(action["id"])
    return seen


def _check_decision(
    decision: Mapping[str, Any],
    here: str,
    action_ids: list[str],
    outputs: Mapping[str, Any],
    report: _Report,
) -> None:
    errors, warnings = check_table(decision, here)
    report.errors.extend(errors)
    report.warnings.extend(warnings)
    for i, pointer in enumerate(decision["inputs"]):
        report.error(
            f"{here}/inputs/{i}",
            _read_problem(pointer, action_ids, decision=False, outputs=outputs),
        )
    for r, rule in enumerate(decision["rules"]):
        report.unknown_state(f"{here}/rules/{r}/then/to", rule["then"]["to"])


def _check_transition(transition: Mapping[str, Any], here: str, report: _Report) -> None:
    for k, state in _items(transition, "from"):
        report.unknown_state(f"{here}/from/{k}", state)
    if report.shaped(f"{here}/to"):
        report.unknown_state(f"{here}/to", transition.get("to"))
    outputs: dict[str, Any] = {}
    action_ids = _check_actions(transition, here, outputs, report)
    decision = transition.get("decision")
    if decision is not None and report.shaped(f"{here}/decision"):
        _check_decision(decision, f"{here}/decision", action_ids, outputs, report)
    concurrency = transition.get("concurrency")
    if isinstance(concurrency, Mapping) and report.shaped(f"{here}/concurrency/key"):
        report.error(
            f"{here}/concurrency/key",
            key_pointer_problem(concurrency["key"], report.data_schema),
        )
    for u, update in _items(transition, "updates"):
        at = f"{here}/updates/{u}"
        if not report.shaped(at):
            continue
        report.error(f"{at}/path", update_path_problem(update["path"]))
        if "from" in update:
            problem = _read_problem(
                update["from"], action_ids, decision=decision is not None, outputs=outputs
            )
            report.error(f"{at}/from", problem)


def _check_start(definition: Mapping[str, Any], report: _Report) -> None:
    """A moment- or schedule-triggered flow names its `start`, a transition leaving initialState."""
    trigger, start = definition.get("trigger"), definition.get("start")
    if not report.shaped("/trigger") or not report.shaped("/start"):
        return
    if start is None:
        if trigger in STARTED_TRIGGERS:
            starter = "each fire" if trigger == SCHEDULE_TRIGGER else "a platform event"
            report.error(
                "/start",
                f'a flow triggered by {trigger!r} must name in "start" the transition'
                f" {starter} starts",
            )
        return
    if trigger not in STARTED_TRIGGERS:
        report.warnings.append(
            Problem(
                "/start", f"start only applies to moment and schedule triggers, not {trigger!r}"
            )
        )
    transitions = definition.get("transitions")
    if not isinstance(transitions, list):
        return
    found = [
        (i, t) for i, t in enumerate(transitions) if isinstance(t, Mapping) and t.get("id") == start
    ]
    if not found:
        report.error("/start", f"unknown transition {start!r}")
        return
    index, chosen = found[0]
    initial = definition.get("initialState")
    if (
        report.shaped("/initialState")
        and report.shaped(f"/transitions/{index}/from")
        and initial not in chosen.get("from", [])
    ):
        report.error("/start", f"transition {start!r} does not leave the initial state {initial!r}")


def validate_definition(
    definition: Any,
    capability_problem: CapabilityProblem | None = None,
    contract_of: ContractOf | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Every problem that stops ``definition`` from being published, then warnings.

    Schema problems come first, then the semantic ones (unknown states, reads,
    duplicate ids, decision tables, capabilities), each with its JSON path. A
    semantic check runs on every part the schema accepted, so a missing field
    does not hide an unknown ``initialState``. Capabilities are judged only when
    ``capability_problem`` is given; constant inputs and reads of outputs only when
    ``contract_of`` gives the adapter's contract (SPEC 17: publish checks what it can
    know).
    """
    schema_errors = _schema_errors(definition)
    if not isinstance(definition, Mapping):
        return schema_errors, []
    states = definition.get("states")
    report = _Report(
        schema_errors=schema_errors,
        # A malformed entry is reported by the schema; the other names are still states.
        states={s for s in states if isinstance(s, str)} if isinstance(states, list) else None,
        capability_problem=capability_problem,
        contract_of=contract_of,
        errors=list(schema_errors),
    )
    if "dataSchema" in definition and report.shaped("/dataSchema"):
        problems = schema_problems(definition["dataSchema"], "/dataSchema")
        report.errors.extend(problems)
        if not problems:
            report.data_schema = definition["dataSchema"]
    if report.shaped("/initialState"):
        report.unknown_state("/initialState", definition.get("initialState"))
    seen: set[str] = set()
    for t, transition in _items(definition, "transitions"):
        if not isinstance(transition, Mapping):
            continue
        here = f"/transitions/{t}"
        if report.shaped(f"{here}/id") and "id" in transition:
            if transition["id"] in seen:
                report.error(f"{here}/id", f"duplicate transition id {transition['id']!r}")
            seen.add(transition["id"])
        _check_transition(transition, here, report)
    _check_start(definition, report)
    if report.shaped("/continue"):
        report.errors.extend(continuation_problems(definition, report.states))
        report.warnings.extend(cycle_warnings(definition))
    report.warnings.extend(writes_after_approval(definition, _reads_only(contract_of)))
    return report.errors, report.warnings


def _reads_only(contract_of: ContractOf | None) -> Callable[[str, int], bool | None] | None:
    """Whether an adapter only reads, as its contract declares (None: not known)."""
    if contract_of is None:
        return None

    def reads_only(capability: str, version: int) -> bool | None:
        contract = contract_of(capability, version)
        return None if contract is None else contract.reads_only

    return reads_only


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
        inputs = dict(raw["input"])
        if (
            raw["capability"] in EMAIL_CAPABILITIES
            and raw.get("email") is True
            and "email" not in inputs
        ):
            # The node's switch reaches notify as its `email` input; a flow cannot map
            # that input itself (publish refuses it). Flows published before that rule
            # keep the input they mapped.
            inputs["email"] = {"const": True}
        return cls(
            id=raw["id"],
            capability=raw["capability"],
            version=raw["version"],
            input=inputs,
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
    concurrency: Concurrency | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Transition:
        return cls(
            id=raw["id"],
            from_states=tuple(raw["from"]),
            actions=[ActionSpec.from_json(action) for action in raw.get("actions", [])],
            to=raw.get("to"),
            decision=raw.get("decision"),
            updates=list(raw.get("updates", [])),
            raw=dict(raw),
            concurrency=Concurrency.from_json(raw.get("concurrency")),
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
    # The transition a platform event starts (moment-triggered flows only).
    start: str | None = None
    # Its executions' priority unless a transition request gives one.
    priority: int = DEFAULT_PRIORITY
    # State -> the transition a finish into that state continues with (`"continue"`).
    continuations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, definition: Mapping[str, Any]) -> FlowDefinition:
        return cls(
            key=definition["key"],
            trigger=definition["trigger"],
            # A flow that gives no data schema accepts any object as its data.
            data_schema=definition.get("dataSchema", {"type": "object"}),
            initial_state=definition["initialState"],
            states=tuple(definition["states"]),
            transitions={t["id"]: Transition.from_json(t) for t in definition["transitions"]},
            raw=dict(definition),
            start=definition.get("start"),
            priority=definition.get("priority", DEFAULT_PRIORITY),
            continuations=declared(definition),
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
