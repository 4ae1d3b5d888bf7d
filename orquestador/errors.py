"""Exception hierarchy of the product; each docstring is the default message."""

from __future__ import annotations


class OrquestadorError(Exception):
    """Something went wrong in orquestador."""

    code = "INTERNAL"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class ConfigError(OrquestadorError):
    """The configuration is invalid."""

    code = "CONFIG_INVALID"

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class DatabaseUnavailable(OrquestadorError):
    """The database cannot be reached."""

    code = "DATABASE_UNAVAILABLE"


class LeaseLost(OrquestadorError):
    """This worker no longer holds the execution's lease; its write was refused."""

    code = "LEASE_LOST"


class RequestChanged(OrquestadorError):
    """The request changed since the transition was accepted."""

    code = "REQUEST_CHANGED"


class ContractMismatch(OrquestadorError):
    """A recovered checkpoint does not match the action about to run."""

    code = "CONTRACT_MISMATCH"


class IntegrationUnavailable(OrquestadorError):
    """No adapter is configured for this capability and version."""

    code = "INTEGRATION_UNAVAILABLE"


class NotReconcilable(OrquestadorError):
    """The execution is not waiting for this decision on this step."""

    code = "NOT_RECONCILABLE"


class StaleItem(NotReconcilable):
    """The execution changed after the bulk was accepted: decide about it on its own."""

    code = "STALE_ITEM"


class NotCancellable(OrquestadorError):
    """Only an execution that has not started (or is waiting) can be cancelled."""

    code = "NOT_CANCELLABLE"


class DecisionInvalid(OrquestadorError):
    """The decision's content is invalid (an output that breaks the schema, an unknown state)."""

    code = "DECISION_INVALID"

    def __init__(
        self,
        code: str,
        message: str,
        paths: list[str] | None = None,
        *,
        problems: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        # Each problem's own words at its path, when it has some; else `message` at `paths`.
        self.problems = list(problems or [])
        self.paths = list(paths or []) or [path for path, _ in self.problems]
