"""Which states and transitions of a flow nothing can reach.

A request starts in the flow's initial state; a transition leaving a reached state
reaches its destination (`to`, every rule's `then.to`) and its actions' error exits
(`onError`). A state no path reaches is dead weight or a mistake; a transition whose
every source state is unreached can never run. Read defensively: it runs on
definitions that passed publishing, and on ones that did not (lint says both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orquestador.errors import Problem


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _destinations(transition: Mapping[str, Any]) -> Iterable[str]:
    if isinstance(transition.get("to"), str):
        yield transition["to"]
    decision = transition.get("decision")
    for rule in _list(decision.get("rules")) if isinstance(decision, Mapping) else []:
        then = rule.get("then") if isinstance(rule, Mapping) else None
        if isinstance(then, Mapping) and isinstance(then.get("to"), str):
            yield then["to"]
    for action in _list(transition.get("actions")):
        if isinstance(action, Mapping) and isinstance(action.get("onError"), str):
            yield action["onError"]


def unreachable(definition: Mapping[str, Any]) -> list[Problem]:
    """One warning per state no path reaches and per transition that can never run."""
    initial = definition.get("initialState")
    states = [s for s in _list(definition.get("states")) if isinstance(s, str)]
    transitions = [
        (t, transition)
        for t, transition in enumerate(_list(definition.get("transitions")))
        if isinstance(transition, Mapping)
    ]
    if not isinstance(initial, str):
        return []
    reached = {initial}
    grew = True
    while grew:
        grew = False
        for _, transition in transitions:
            if reached & set(_list(transition.get("from"))):
                more = set(_destinations(transition)) - reached
                reached |= more
                grew = grew or bool(more)
    problems = [
        Problem(f"/states/{n}", f"no transition reaches state {state!r} from {initial!r}")
        for n, state in enumerate(states)
        if state not in reached
    ]
    problems += [
        Problem(
            f"/transitions/{t}/from",
            f"transition {transition.get('id')!r} can never run: no path reaches any state"
            " it leaves from",
        )
        for t, transition in transitions
        if not reached & set(_list(transition.get("from")))
    ]
    return problems
