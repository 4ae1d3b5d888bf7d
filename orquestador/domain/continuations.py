"""States that continue by themselves: `"continue": {"STATE": "TRANSITION_ID"}`, checked.

When a finish moves a request into a state the flow names here, the transition named is
accepted in the finish's own transaction, as if the person who started the run had asked
for it (queue/continuations.py). Publishing refuses a continuation from a state the flow
does not have, to a transition it does not have, or to one that does not leave that
state. Two findings are warnings, for publishing and `flows lint` alike:

- a cycle of continuations with nothing in it that waits (an approval, a machine wait):
  it runs on by itself until MAX_CONTINUATIONS, then parks;
- an action after an `approval@1` in the same transition that may write: it runs
  whatever the decision, approved or rejected (the approval only chooses where the
  transition goes); a continuation from the approved state is where it belongs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jsonpointer import JsonPointer

from orquestador.errors import Problem

# Steps that wait for something outside the engine (a person, a machine's agent): a
# cycle of continuations through one of them cannot spin on its own.
WAITING_CAPABILITIES = frozenset({"approval", "machine.wait"})
# The built-ins that never write, for when no adapter is at hand to say (`flows lint`).
READ_ONLY_BUILTINS = frozenset({"approval", "machine.wait", "noop"})
APPROVAL = "approval"

# Whether (capability, version) only reads: True, False, or None when not known here.
ReadsOnly = Callable[[str, int], bool | None]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _at(state: str) -> str:
    return "/continue" + JsonPointer.from_parts([state]).path


def _transitions(definition: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {
        t["id"]: t
        for t in _list(definition.get("transitions"))
        if isinstance(t, Mapping) and isinstance(t.get("id"), str)
    }


def declared(definition: Mapping[str, Any]) -> dict[str, str]:
    """The flow's continuations, state to transition (the well-formed entries)."""
    raw = definition.get("continue")
    if not isinstance(raw, Mapping):
        return {}
    return {s: t for s, t in raw.items() if isinstance(s, str) and isinstance(t, str)}


def continuation_problems(definition: Mapping[str, Any], states: set[str] | None) -> list[Problem]:
    """What stops a flow's continuations from being published, each at its path."""
    problems = []
    transitions = _transitions(definition)
    for state, transition_id in declared(definition).items():
        if states is not None and state not in states:
            problems.append(Problem(_at(state), f"unknown state {state!r}"))
            continue
        transition = transitions.get(transition_id)
        if transition is None:
            problems.append(Problem(_at(state), f"unknown transition {transition_id!r}"))
        elif state not in _list(transition.get("from")):
            problems.append(
                Problem(
                    _at(state),
                    f"transition {transition_id!r} does not leave state {state!r}: a "
                    "continuation starts from the state the request reached",
                )
            )
    return problems


def _finish_states(transition: Mapping[str, Any]) -> Iterable[str]:
    """Where a finish of the transition can move the request (an error exit never
    continues: only a finish does)."""
    if isinstance(transition.get("to"), str):
        yield transition["to"]
    decision = transition.get("decision")
    for rule in _list(decision.get("rules")) if isinstance(decision, Mapping) else []:
        then = rule.get("then") if isinstance(rule, Mapping) else None
        if isinstance(then, Mapping) and isinstance(then.get("to"), str):
            yield then["to"]


def followed_by(definition: Mapping[str, Any], transition_id: str) -> list[str]:
    """The transitions a run of `transition_id` may continue into, by itself, one after
    another: those its finish states continue with, then theirs (each once)."""
    transitions = _transitions(definition)
    continuing = declared(definition)
    found: list[str] = []
    pending = [transition_id]
    while pending:
        transition = transitions.get(pending.pop(0))
        for state in _finish_states(transition) if transition is not None else ():
            onward = continuing.get(state)
            if onward is not None and onward != transition_id and onward not in found:
                found.append(onward)
                pending.append(onward)
    return found


def _waits(transition: Mapping[str, Any]) -> bool:
    return any(
        isinstance(action, Mapping) and action.get("capability") in WAITING_CAPABILITIES
        for action in _list(transition.get("actions"))
    )


def cycle_warnings(definition: Mapping[str, Any]) -> list[Problem]:
    """One warning per continuing state on a cycle of continuations that never waits."""
    transitions = _transitions(definition)
    continuing = declared(definition)
    # From a continuing state, the continuing states its continuation's finish can reach
    # without waiting for anything.
    onward: dict[str, list[tuple[str, str]]] = {}
    for state, transition_id in continuing.items():
        transition = transitions.get(transition_id)
        if transition is None or _waits(transition):
            continue
        onward[state] = [
            (transition_id, reached)
            for reached in dict.fromkeys(_finish_states(transition))
            if reached in continuing
        ]
    problems = []
    for start in sorted(onward):
        loop = _loop_back(start, onward)
        if loop is not None:
            through = ", ".join(loop)
            problems.append(
                Problem(
                    _at(start),
                    f"continuing from {start!r} can come back to it through {through} with "
                    "nothing that waits (an approval, a machine wait): it runs by itself "
                    "until MAX_CONTINUATIONS, then parks for a person",
                )
            )
    return problems


def _loop_back(start: str, onward: Mapping[str, list[tuple[str, str]]]) -> list[str] | None:
    """The transitions of a path of continuations from `start` back to it, or None."""
    seen = {start}
    paths: list[tuple[str, list[str]]] = [(start, [])]
    while paths:
        state, taken = paths.pop()
        for transition_id, reached in onward.get(state, []):
            if reached == start:
                return [*taken, transition_id]
            if reached not in seen:
                seen.add(reached)
                paths.append((reached, [*taken, transition_id]))
    return None


def writes_after_approval(
    definition: Mapping[str, Any], reads_only: ReadsOnly | None = None
) -> list[Problem]:
    """One warning per action after an `approval@1` of its transition that may write.

    `reads_only` says what an adapter's contract declares; without it (or for an adapter
    it does not know) only the built-ins that never write count as reads.
    """
    problems = []
    for t, transition in enumerate(_list(definition.get("transitions"))):
        if not isinstance(transition, Mapping):
            continue
        approved_by = None
        for a, action in enumerate(_list(transition.get("actions"))):
            if not isinstance(action, Mapping):
                continue
            capability, version = action.get("capability"), action.get("version")
            if approved_by is not None and not _only_reads(capability, version, reads_only):
                problems.append(
                    Problem(
                        f"/transitions/{t}/actions/{a}",
                        f"{action.get('id')!r} may write, and runs after the approval "
                        f"{approved_by!r} whatever its decision: move it to a transition "
                        'that the approved state continues into ("continue")',
                    )
                )
            if capability == APPROVAL and approved_by is None:
                approved_by = action.get("id")
    return problems


def _only_reads(capability: Any, version: Any, reads_only: ReadsOnly | None) -> bool:
    if reads_only is not None and isinstance(capability, str) and isinstance(version, int):
        known = reads_only(capability, version)
        if known is not None:
            return known
    return capability in READ_ONLY_BUILTINS
