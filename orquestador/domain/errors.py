"""Errors raised by the pure domain code; each docstring is its default message."""

from __future__ import annotations

from typing import Any

from orquestador.errors import OrquestadorError, Problem


class DomainError(OrquestadorError):
    """A domain rule was violated."""

    code = "DOMAIN_ERROR"

    def __init__(self, code: str | None = None, message: str | None = None) -> None:
        # The code is per instance because one class (DecisionError) covers
        # several stable codes that callers and the CLI report verbatim.
        self.code = code or type(self).code
        super().__init__(message)


class DecisionError(DomainError):
    """The decision table could not choose a result."""

    code = "INVALID_TABLE"
    CODES = ("NO_RULE_MATCHED", "HIT_POLICY_VIOLATION", "INVALID_TABLE")


class UpdateError(DomainError):
    """The update cannot be applied to the request data."""

    code = "INVALID_UPDATE"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(None, message)


class MappingError(DomainError):
    """A mapping source could not be resolved in the evaluation context."""

    code = "MAPPING_FAILED"

    def __init__(
        self, message: str | None = None, *, pointer: str | None = None, field: str | None = None
    ) -> None:
        super().__init__(None, message)
        self.pointer = pointer  # the source pointer that did not resolve, when known
        self.field = field  # the input field whose source failed, when known

    @property
    def location(self) -> dict[str, Any]:
        """Where it failed, for an error detail: names and pointers only, never values
        (typed Any so that it spreads into an error detail's keywords)."""
        found = {"pointer": self.pointer, "field": self.field}
        return {key: value for key, value in found.items() if value is not None}


class DataValidationError(DomainError):
    """The request data does not satisfy the flow's data schema."""

    code = "DATA_INVALID"

    def __init__(self, problems: list[Problem], message: str | None = None) -> None:
        self.problems = list(problems)
        if message is None:
            summary = "; ".join(f"{p.path or '/'}: {p.message}" for p in self.problems)
            message = f"{(self.__doc__ or '').strip()} ({summary})" if summary else None
        super().__init__(None, message)


class DataSchemaError(DataValidationError):
    """The flow's data schema cannot be used to check data; publish a version that fixes it."""

    code = "DATA_SCHEMA_INVALID"
