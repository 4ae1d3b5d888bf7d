"""The cases of `orquestador flows test`: what each runs, and whether it ended as expected.

A cases file is `{"cases": [case, ...]}`; a case runs one transition of the flow as a
dry run, its steps answering what `outcomes` says (the dry run's own outcomes, so
error exits, passed deadlines and rejections are rehearsed at once, no clock waited
for), and `expect` names what must hold once it ends: the request's `state`, the
decision's `outcome`, the execution's `status` and `errorCode`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from orquestador.actions.rehearsals import OUTCOMES_SCHEMA
from orquestador.db.schema import EXECUTION_STATUSES

MAX_CASES = 500

CASES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["cases"],
    "additionalProperties": False,
    "properties": {
        "cases": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_CASES,
            "items": {
                "type": "object",
                "required": ["name", "data", "transition", "expect"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 200},
                    "data": {"type": "object"},
                    "state": {"type": "string", "minLength": 1},
                    "transition": {"type": "string", "minLength": 1},
                    "outcomes": OUTCOMES_SCHEMA,
                    "expect": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": False,
                        "properties": {
                            "state": {"type": "string"},
                            "outcome": {"type": "string"},
                            "status": {"enum": list(EXECUTION_STATUSES)},
                            "errorCode": {"type": "string"},
                        },
                    },
                },
            },
        }
    },
}
_VALIDATOR = Draft202012Validator(CASES_SCHEMA)


class CasesInvalid(ValueError):
    """The cases file is not of the cases format; its problems, one per line."""


@dataclass(frozen=True)
class Case:
    name: str
    transition: str
    data: dict[str, Any]
    expect: dict[str, str]
    state: str | None = None
    outcomes: dict[str, Any] | None = None

    def dry_run_body(self) -> dict[str, Any]:
        """The body of the dry run that plays this case."""
        body: dict[str, Any] = {"transition": self.transition, "data": self.data}
        if self.state is not None:
            body["state"] = self.state
        if self.outcomes:
            body["outcomes"] = self.outcomes
        return body


@dataclass(frozen=True)
class Ended:
    """How a case's dry run ended, in the terms `expect` uses."""

    status: str
    state: str | None
    outcome: str | None
    error_code: str | None

    @classmethod
    def of(cls, execution: Mapping[str, Any], request: Mapping[str, Any]) -> Ended:
        decision = execution.get("decision") or {}
        return cls(
            status=execution["status"],
            state=request.get("state"),
            outcome=execution.get("outcome") or decision.get("outcome"),
            error_code=execution.get("errorCode"),
        )

    def said(self) -> str:
        words = [f"status {self.status}", f"state {self.state}"]
        if self.outcome is not None:
            words.append(f"outcome {self.outcome}")
        if self.error_code is not None:
            words.append(f"errorCode {self.error_code}")
        return ", ".join(words)


def parse_cases(document: Any) -> list[Case]:
    """The cases of a parsed cases file; CasesInvalid names every problem at its path."""
    problems = sorted(_VALIDATOR.iter_errors(document), key=lambda error: list(error.absolute_path))
    if problems:
        raise CasesInvalid(
            "\n".join(f"{_pointer(error.absolute_path)}: {error.message}" for error in problems)
        )
    cases = [
        Case(
            name=item["name"],
            transition=item["transition"],
            data=item["data"],
            expect=item["expect"],
            state=item.get("state"),
            outcomes=item.get("outcomes"),
        )
        for item in document["cases"]
    ]
    seen: set[str] = set()
    for n, case in enumerate(cases):
        if case.name in seen:
            raise CasesInvalid(f"/cases/{n}/name: the name {case.name!r} is given twice")
        seen.add(case.name)
    return cases


@dataclass(frozen=True)
class Played:
    """A case's dry run: how it ended, or why it could not start or did not end."""

    case: Case
    ended: Ended | None = None
    problem: str | None = None
    execution_id: str | None = None
    seconds: float = 0.0

    @property
    def reasons(self) -> list[str]:
        """Why the case failed, in words; none when it passed."""
        if self.ended is None:
            return [self.problem or "it did not run"]
        found = {
            "state": self.ended.state,
            "outcome": self.ended.outcome,
            "status": self.ended.status,
            "errorCode": self.ended.error_code,
        }
        return [
            f"expected {name} {wanted}, got {found[name]}"
            for name, wanted in self.case.expect.items()
            if found[name] != wanted
        ]

    @property
    def passed(self) -> bool:
        return not self.reasons


def _pointer(path: Any) -> str:
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in path)
